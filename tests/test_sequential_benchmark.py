"""benchmarks/sequential.py --merge: the quality records of runs made side by side (the validation and test
runs, seeds in parallel processes, the baselines in another) pooled as one run would have written them; each
model's MovieLens settings (MOVIELENS_SETTINGS, the common flags, --set MODEL.FIELD=VALUE) and their checks."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from hugerec.data.sessions import Sequences, last_n

ROOT = Path(__file__).resolve().parents[1]


def _r(config: str, method: str, value: float, unit: str = "fraction", higher: bool = True) -> dict[str, object]:
    return {"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": higher}


def test_merge_pools_seeds_and_takes_ratios_against_the_strongest_baseline(tmp_path: Path) -> None:
    runs = {
        "baselines.json": [
            _r("quality movielens recall@10", "slist", 0.28),
            _r("quality movielens recall@10", "popular", 0.04),
            _r("quality movielens ndcg@10", "slist", 0.16),
            _r("quality movielens ndcg@10", "sknn", 0.17),
        ],
        "seed0.json": [
            _r("quality movielens recall@10 seed 0", "hugerec-hstu", 0.33),
            _r("quality movielens ndcg@10 seed 0", "hugerec-hstu", 0.19),
            _r("quality movielens recall@10 seed 0", "hugerec-sasrec", 0.30),
            _r("quality movielens ndcg@10 seed 0", "hugerec-sasrec", 0.18),
            _r("quality movielens epochs", "hugerec-hstu", 9.0, "epochs (chosen on valid)", False),
        ],
        "seed1.json": [
            _r("quality movielens recall@10 seed 1", "hugerec-hstu", 0.35),
            _r("quality movielens ndcg@10 seed 1", "hugerec-hstu", 0.21),
        ],
    }
    for name, records in runs.items():
        (tmp_path / name).write_text(json.dumps(records))
    out = tmp_path / "merged.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sequential.py"), "--merge", *runs, "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = {(r["config"], r["method"], r["unit"]): r["value"] for r in json.loads(out.read_text())}
    assert got[("quality movielens recall@10", "hugerec-hstu", "fraction")] == pytest.approx(0.34)
    assert got[("quality movielens recall@10 spread", "hugerec-hstu", "std over seeds")] == pytest.approx(0.01)
    assert got[("quality movielens epochs", "hugerec-hstu", "epochs (chosen on valid)")] == 9.0
    assert got[("quality movielens recall@10", "slist", "fraction")] == 0.28
    # each metric against its own strongest baseline: slist on recall, sknn on ndcg
    assert got[("movielens hstu", "hugerec-hstu", "recall@10 x slist (strongest baseline)")] == pytest.approx(0.34 / 0.28)
    assert got[("movielens hstu", "hugerec-hstu", "ndcg@10 x sknn (strongest baseline)")] == pytest.approx(0.20 / 0.17)
    assert got[("movielens hstu", "hugerec-hstu", "recall@10 x hugerec-sasrec")] == pytest.approx(0.34 / 0.30)
    assert got[("movielens sasrec", "hugerec-sasrec", "ndcg@10 x sknn (strongest baseline)")] == pytest.approx(0.18 / 0.17)


def _sequential() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sequential_benchmark", ROOT / "benchmarks" / "sequential.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _args(models: str, *sets: str, **flags: object) -> argparse.Namespace:
    seq = _sequential()
    given = dict.fromkeys(seq.SETTING_FLAGS, None) | flags
    return argparse.Namespace(models=models, set=list(sets), **given)


def test_each_model_gets_its_settings_then_the_common_flags_then_its_set_items() -> None:
    seq = _sequential()
    got = seq.movielens_settings(_args("hugerec-sasrec,hugerec-hstu"), ["hugerec-sasrec", "hugerec-hstu"])
    assert got == {name: seq.MOVIELENS_SETTINGS[name] for name in ("hugerec-sasrec", "hugerec-hstu")}
    args = _args("hugerec-sasrec,hugerec-hstu", "hugerec-hstu.layers=3", "hugerec-hstu.hstu_temperature=0.05", dropout=0.3)
    got = seq.movielens_settings(args, ["hugerec-sasrec", "hugerec-hstu"])
    assert got["hugerec-sasrec"] == dataclasses.replace(seq.MOVIELENS_SETTINGS["hugerec-sasrec"], dropout=0.3)
    assert got["hugerec-hstu"] == dataclasses.replace(seq.MOVIELENS_SETTINGS["hugerec-hstu"], dropout=0.3, layers=3, hstu_temperature=0.05)


@pytest.mark.parametrize(("model", "blocks"), [("hugerec-hstu", "layers"), ("hugerec-sasrec", "encoder.blocks")])
@pytest.mark.parametrize("layers", [4, 8])
def test_set_layers_builds_that_many_blocks_of_either_model(model: str, blocks: str, layers: int) -> None:
    """--set MODEL.layers=N (round 6's depth points) reaches the model built for that model alone, the other keeps
    its shipped depth; the blocks are distinct modules (N independent weight sets, not one block repeated)."""
    seq = _sequential()
    other = "hugerec-sasrec" if model == "hugerec-hstu" else "hugerec-hstu"
    settings = seq.movielens_settings(_args(f"{model},{other}", f"{model}.layers={layers}"), [model, other])
    built = seq.build_model(model, 50, settings[model], seed=0)
    stack = built.get_submodule(blocks)
    assert len(stack) == layers
    assert len({id(p) for block in stack for p in block.parameters()}) == layers * len(list(stack[0].parameters()))
    kept = seq.build_model(other, 50, settings[other], seed=0)
    other_blocks = "layers" if other == "hugerec-hstu" else "encoder.blocks"
    assert len(kept.get_submodule(other_blocks)) == seq.MOVIELENS_SETTINGS[other].layers


def test_shipped_depths_are_the_validated_ones() -> None:
    """HSTU ships 8 blocks (HSTU-large, chosen on validation in round 6), SASRec 2 (not offered 8 yet); the ranking
    part keeps the 2-block HSTU its figures were measured with."""
    seq = _sequential()
    assert seq.MOVIELENS_SETTINGS["hugerec-hstu"].layers == 8
    assert seq.MOVIELENS_SETTINGS["hugerec-sasrec"].layers == 2
    assert seq.RANKING_LAYERS == 2


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("hugerec-hstu.layers=x", "layers must be an integer, got 'x'"),
        ("hugerec-hstu.layers=0", "layers must be an int >= 1, got 0"),
        ("hugerec-hstu.dropout=1.5", "dropout must be a number in [0, 1), got 1.5"),
        ("hugerec-hstu.lr=nan", "lr must be a finite number > 0, got nan"),
        ("hugerec-hstu.windows=all", "windows must be 'last' or 'sliding', got 'all'"),
        ("hugerec-hstu.heads=3", "dim 64 must be a multiple of heads 3"),
        ("hugerec-hstu.depth=4", "unknown field 'depth'"),
        ("hugerec-sasrec.layers=4", "model 'hugerec-sasrec' is not in --models"),
        ("hugerec-hstu.layers", "expected MODEL.FIELD=VALUE"),
        ("hugerec-hstu.times=yes", "times must be true or false, got 'yes'"),
    ],
)
def test_a_bad_set_item_exits_naming_it(item: str, named: str) -> None:
    with pytest.raises(SystemExit) as got:
        _sequential().movielens_settings(_args("hugerec-hstu", item), ["hugerec-hstu"])
    assert named in str(got.value)
    assert item.partition("=")[0] in str(got.value)


def test_times_feed_hstu_in_training_and_scoring_and_are_refused_for_sasrec() -> None:
    """--set hugerec-hstu.times=true: the settings carry it, training reads the windows' times (TimedWindows
    through the family) and the scores read the histories' times; SASRec cannot take it."""
    seq = _sequential()
    assert seq.MOVIELENS_SETTINGS["hugerec-hstu"].times  # chosen on validation (round 4)
    got = seq.movielens_settings(_args("hugerec-hstu", "hugerec-hstu.times=false"), ["hugerec-hstu"])
    assert got["hugerec-hstu"] == dataclasses.replace(seq.MOVIELENS_SETTINGS["hugerec-hstu"], times=False)
    with pytest.raises(SystemExit, match="hugerec-sasrec cannot use timestamps"):
        seq.movielens_settings(_args("hugerec-sasrec", "hugerec-sasrec.times=True"), ["hugerec-sasrec"])
    rng = np.random.default_rng(0)
    n, length, num_items = 12, 9, 20
    times = np.cumsum(rng.integers(1, 10**6, n * length))
    train = Sequences(np.arange(n), np.arange(0, n * length + 1, length), rng.integers(1, num_items + 1, n * length), times)
    split = seq.Split("valid", train, last_n(train, seq.HISTORY), last_n(train, seq.HISTORY, values=train.timestamps), np.ones(n, np.int64), None, None, num_items)
    s = seq.DeepSettings(max_len=4, lr=1e-2, batch=4, windows="sliding", dim=8, heads=2, times=True)
    model = seq.train_model("hugerec-hstu", split, s, 1, 0)
    with torch.no_grad():
        for layer in model.blocks:  # a visible time bias
            layer.time_bias.normal_()
    assert not torch.allclose(seq.model_block(model, split, True)(0, n), seq.model_block(model, split, False)(0, n))
    with pytest.raises(ValueError, match="SASRec cannot use timestamps"):
        seq.train_model("hugerec-sasrec", split, s, 1, 0)


def _run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/sequential.py with `args`, run from tmp_path with no data folder in reach."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sequential.py"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HUGEREC_DATA": str(tmp_path / "no-data")},
    )


def test_a_bad_set_item_exits_before_any_work(tmp_path: Path) -> None:
    done = _run_script(tmp_path, "--only", "movielens", "--models", "hugerec-hstu", "--set", "hugerec-hstu.dropout=-0.1")
    assert done.returncode != 0
    assert "hugerec-hstu.dropout=-0.1" in done.stderr
    assert "dropout must be a number in [0, 1), got -0.1" in done.stderr


def test_lr_decay_epochs_is_a_linear_decay_of_every_lr_over_epochs_of_the_runs_data() -> None:
    seq = _sequential()
    settings = seq.DeepSettings(max_len=50, lr=6e-3, batch=128, windows="sliding", lr_decay_epochs=20)
    schedule = seq.lr_schedule(settings)
    assert (schedule.decay_epochs, schedule.power, schedule.end_factor, schedule.sparse) == (20.0, 1.0, 0.0, True)
    for steps_per_epoch in (87, 90):  # the validation run's and a longer refit's: the same lr after each epoch
        steps = schedule.in_steps(steps_per_epoch)
        assert [steps.factor(e * steps_per_epoch) for e in (0, 5, 10)] == pytest.approx([1.0, 0.75, 0.5])
    assert seq.lr_schedule(dataclasses.replace(settings, lr_decay_epochs=0)) is None  # 0: constant
    with pytest.raises(ValueError, match="lr_decay_epochs must be an int >= 0, got -1"):
        dataclasses.replace(settings, lr_decay_epochs=-1)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"max_epochs": 30}, "hugerec-hstu: --max-epochs 30 trains past its lr decay of 20 epochs"),
        ({"epochs": "hugerec-hstu=21"}, "hugerec-hstu: --epochs hugerec-hstu=21 trains past its lr decay of 20 epochs"),
    ],
)
def test_a_run_longer_than_its_decay_is_refused(flags: dict[str, object], named: str) -> None:
    seq = _sequential()
    settings = {"hugerec-hstu": dataclasses.replace(seq.MOVIELENS_SETTINGS["hugerec-hstu"], lr_decay_epochs=20)}
    args = argparse.Namespace(**({"epochs": None, "max_epochs": 20, "quick": False} | flags))
    with pytest.raises(SystemExit, match=named):
        seq.check_decay_horizons(args, settings)
    seq.check_decay_horizons(argparse.Namespace(epochs="hugerec-hstu=20", max_epochs=40, quick=False), settings)  # within


def test_lr_decay_epochs_below_1_exits_in_one_line(tmp_path: Path) -> None:
    done = _run_script(tmp_path, "--only", "movielens", "--lr-decay-epochs", "0")
    assert done.returncode != 0
    assert done.stderr.strip() == "benchmarks/sequential.py: --lr-decay-epochs must be an integer >= 1, got 0"


def _small_split(seq: ModuleType) -> object:
    rng = np.random.default_rng(0)
    n, length, num_items = 12, 9, 20
    train = Sequences(np.arange(n), np.arange(0, n * length + 1, length), rng.integers(1, num_items + 1, n * length), np.zeros(n * length, np.int64))
    targets = rng.integers(1, num_items + 1, n)
    return seq.Split("valid", train, last_n(train, seq.HISTORY), last_n(train, seq.HISTORY, values=train.timestamps), targets, None, None, num_items)


def test_average_epochs_is_a_setting_and_one_run_gives_every_ks_curve() -> None:
    """--set MODEL.average_epochs=K sets the field (K >= 1); a validation run with a grid scores the raw weights and
    each K's mean after every epoch, the raw curve the same as a run without the grid; a refit with
    average_epochs K (fit's mean) ends with the weights the grid's K took at that epoch."""
    seq = _sequential()
    got = seq.movielens_settings(_args("hugerec-sasrec", "hugerec-sasrec.average_epochs=3"), ["hugerec-sasrec"])
    assert got["hugerec-sasrec"] == dataclasses.replace(seq.MOVIELENS_SETTINGS["hugerec-sasrec"], average_epochs=3)
    with pytest.raises(SystemExit, match=r"hugerec-hstu.average_epochs=0.*average_epochs must be an int >= 1, got 0"):
        seq.movielens_settings(_args("hugerec-hstu", "hugerec-hstu.average_epochs=0"), ["hugerec-hstu"])
    split = _small_split(seq)
    s = seq.DeepSettings(max_len=4, lr=1e-2, batch=4, windows="sliding", dim=8)
    epochs, curves = seq.choose_epochs("hugerec-sasrec", split, s, 3, 3, "recall@10", 10, None, 0, (1, 2, 3))
    assert sorted(curves) == [1, 2, 3] and all(len(c) == 3 for c in curves.values())
    assert curves[2][0] == curves[1][0]  # after one epoch every mean is that epoch's weights
    assert curves[3][1] == curves[2][1]  # after two, the mean of 3 is the mean of the 2 there are
    _, plain = seq.choose_epochs("hugerec-sasrec", split, s, 3, 3, "recall@10", 10, None, 0)
    assert plain == {1: curves[1]} and 1 <= epochs <= 3
    taken: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    means = seq.EpochMeans((1, 2))

    def on_epoch(model: torch.nn.Module, epoch: int) -> None:
        for k in means.each(model, epoch):
            taken[(epoch, k)] = {n: v.clone() for n, v in model.state_dict().items()}

    seq.train_model("hugerec-sasrec", split, s, 3, 0, None, on_epoch)
    refit = seq.train_model("hugerec-sasrec", split, dataclasses.replace(s, average_epochs=2), 3, 0).state_dict()
    assert not torch.equal(taken[(2, 2)]["lookup.items.tables.item.weight"], taken[(2, 1)]["lookup.items.tables.item.weight"])
    assert [n for n, v in refit.items() if not torch.equal(v, taken[(2, 2)][n])] == []


@pytest.mark.parametrize("grid", ["1,x", "0,3", ""])
def test_a_bad_average_grid_exits_naming_it(grid: str) -> None:
    seq = _sequential()
    if not grid:
        assert seq.average_grid(grid) == ()
        return
    with pytest.raises(SystemExit, match=f"--average-epochs-grid '{grid}'"):
        seq.average_grid(grid)


def test_the_ranking_part_reranks_the_next_item_top_100_and_reads_no_target_time() -> None:
    """movielens hstu ranking's protocol on a small split: the dot product's top-100 order gives the full
    ranking's Recall@10 / NDCG@10 (the same exclusions; a target's rank under 10 is its rank in the top-100);
    the head's order is the top-100 sorted by the (uncached) ranking-head scores at the latest event's time."""
    seq = _sequential()
    rng = np.random.default_rng(1)
    n, length, num_items = 30, 12, 150
    times = np.cumsum(rng.integers(1, 10**6, n * length))
    train = Sequences(np.arange(n), np.arange(0, n * length + 1, length), rng.integers(1, num_items + 1, n * length), times)
    split = seq.Split("valid", train, last_n(train, seq.HISTORY), last_n(train, seq.HISTORY, values=train.timestamps),
                      np.ones(n, np.int64), (train.offsets, train.items), None, num_items)
    s = seq.DeepSettings(max_len=6, lr=1e-2, batch=8, windows="sliding", dim=8, heads=2, times=True)
    model, rate = seq._fit_ranked(split, s, 1, 0, 1.0)
    assert rate > 0
    hist, hist_t = split.histories[:, -6:], split.times[:, -6:]
    scores = seq.model_scores(model, hist, hist_t)(0, n).clone()
    for i in range(n):
        scores[i, torch.from_numpy(train.items[train.offsets[i] : train.offsets[i + 1]] - 1)] = float("-inf")
    top = torch.topk(scores, seq.RERANK_DEPTH, dim=1).indices + 1
    pick = np.where(np.arange(n) % 3 == 0, 3, np.where(np.arange(n) % 3 == 1, 40, 0))  # ranks 4, 41 and 1 by the dot product
    split = dataclasses.replace(split, targets=top[np.arange(n), pick].numpy())
    got = seq._reranked_metrics(model, split, True, 10)
    full = seq.split_metrics(split, seq.model_block(model, split, True), 10)
    for metric in ("recall@10", "ndcg@10"):
        assert got["order"][metric] == pytest.approx(full[metric])
    with torch.no_grad():
        head = model.candidate_scores_uncached(torch.from_numpy(hist[:, 1:]), top, torch.from_numpy(hist_t[:, 1:]), torch.from_numpy(hist_t[:, -1]))
    target_score = head[np.arange(n), pick]
    ranks = (head > target_score[:, None]).sum(dim=1).numpy()
    assert got["head"]["recall@10"] == pytest.approx(float((ranks < 10).mean()))
    assert got["head"]["ndcg@10"] == pytest.approx(float(np.where(ranks < 10, 1 / np.log2(ranks + 2), 0).mean()), rel=1e-5)
