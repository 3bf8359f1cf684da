"""The model file of every family: round trip with what built the model; damaged, crafted, foreign files and
files of another family are one-line errors naming the file."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.data.schema import Schema
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, RowWiseAdagrad
from hugerec.models.gbm import FeatureMatrix, LightGBMConfig, XGBoostConfig
from hugerec.models.hstu import HSTU, HSTUConfig, HSTUOptions
from hugerec.models.mf import MFConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import DLRMConfig
from hugerec.models.registry import Family, build_model
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, GRU4RecConfig, MLMConfig, SASRecConfig, item_table
from hugerec.models.two_tower import TwoTowerConfig
from hugerec.serving.bundles.any_bundle import load
from hugerec.serving.bundles.export import export
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.model_file import RawIds, load_model, save_model
from hugerec.training.sequential import SequentialFamily, recommend_next, window_batches
from hugerec.training.trainer import TrainConfig, fit

SCHEMA = Schema.build(dense=["d0", "d1"], sparse={"user": 50, "item": 30})
CONFIG = DLRMConfig(bottom=(8, 4), top=(8, 1))
OPTIMIZER = RowWiseAdagrad(lr=0.1)


def saved(tmp_path: Path) -> tuple[Path, RecModel]:
    torch.manual_seed(0)
    tables = SCHEMA.table_configs(dim=4)
    model = build_model(CONFIG, tables, 2, OPTIMIZER)
    assert isinstance(model, RecModel)
    return save_model(tmp_path / "model.pt", model, CONFIG, OPTIMIZER, tables=tables, schema=SCHEMA.to_dict()), model


def test_round_trip_rebuilds_the_model_and_its_schema(tmp_path: Path) -> None:
    path, model = saved(tmp_path)
    back = load_model(path)
    assert back.config == CONFIG and back.optimizer == OPTIMIZER and Schema.from_dict(back.schema or {}) == SCHEMA
    assert back.family is Family.RANKING and back.model_type == "dlrm" and back.ids is None
    assert [t.name for t in back.tables] == ["user", "item"] and back.model.num_dense == 2  # type: ignore[union-attr]
    for k, v in model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k  # type: ignore[union-attr]
    bare = save_model(tmp_path / "bare.pt", model, CONFIG, OPTIMIZER, tables=back.tables)  # the schema is optional
    assert load_model(bare).schema is None


def test_a_model_file_with_disk_tables_keeps_its_rows_past_newer_snapshots(tmp_path: Path) -> None:
    """A disk-tier table's rows stay in the snapshot the model file names; save_model pins it, so the file
    still loads its own rows after the table has taken more than three newer snapshots."""
    from dataclasses import replace

    from hugerec.sparse.batch import Batch
    from hugerec.sparse.features import SparseFeatures

    torch.manual_seed(0)
    tables = [replace(t, storage="disk", cache_rows=20, path=str(tmp_path / f"{t.name}.rows")) for t in SCHEMA.table_configs(dim=4)]  # type: ignore[arg-type]
    model = build_model(CONFIG, tables, 2, OPTIMIZER)
    assert isinstance(model, RecModel)

    def train_step(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        sparse = SparseFeatures.from_dense({"user": torch.randint(0, 50, (8,), generator=g), "item": torch.randint(0, 30, (8,), generator=g)})
        model(Batch(torch.randn(8, 2, generator=g), sparse, torch.zeros(8))).sum().backward()

    train_step(0)
    path = save_model(tmp_path / "model.pt", model, CONFIG, OPTIMIZER, tables=tables)
    rows = model.sparse_arch.read_rows("user", torch.arange(50))[0].clone()
    for seed in range(1, 6):
        train_step(seed)
        model.state_dict()  # a checkpoint's snapshot
    back = load_model(path)
    assert torch.equal(back.model.sparse_arch.read_rows("user", torch.arange(50))[0], rows)  # type: ignore[union-attr]


def test_flipped_bytes_are_reported_not_loaded(tmp_path: Path) -> None:
    """#20 defects 4 and 8: 64 flipped bytes loaded as wrong weights; now the file is named as damaged."""
    path, _ = saved(tmp_path)
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"^load_model: .*model\.pt is damaged") as e:
        load_model(path)
    assert "\n" not in str(e.value)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"model\.pt is damaged or not a model file"):
        load_model(path)
    with pytest.raises(FileNotFoundError, match="no model file at"):
        load_model(tmp_path / "absent.pt")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_crafted_and_foreign_files_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"spec": "{}", "state": _RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"cannot read .*evil\.pt as a model file: UnpicklingError"):
        load_model(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match=r"foreign\.pt is not a hugerec model file: 'spec'"):
        load_model(tmp_path / "foreign.pt")
    path, model = saved(tmp_path)
    spec = json.loads(torch.load(path, weights_only=True)["spec"])
    torch.save({"spec": json.dumps({**spec, "format": 9}), "state": model.state_dict()}, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="model format 9, this hugerec reads 3"):
        load_model(tmp_path / "future.pt")
    spec["tables"][0]["num_rows"] = 51
    torch.save({"spec": json.dumps(spec), "state": model.state_dict()}, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match=r"weights in .*mismatch\.pt do not fit the model its spec describes"):
        load_model(tmp_path / "mismatch.pt")


def test_the_ranking_format_before_every_family_shared_it_still_reads(tmp_path: Path) -> None:
    path, model = saved(tmp_path)
    spec = json.loads(torch.load(path, weights_only=True)["spec"])
    old = {k: v for k, v in spec.items() if k not in ("family", "extra")} | {"format": 1}
    torch.save({"spec": json.dumps(old), "state": model.state_dict()}, tmp_path / "v1.pt")
    assert load_model(tmp_path / "v1.pt").config == CONFIG
    retrieval_v2 = {"format": 2, "task": "retrieval", "model_type": "mf"}  # the separate retrieval file of before
    torch.save({"spec": json.dumps(retrieval_v2), "state": {}}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"old\.pt is not a hugerec model file: model format 2 retrieval, this hugerec reads 3: train it again"):
        load_model(tmp_path / "old.pt")


def _retrieval_ids(users: int, items: int) -> RawIds:
    offsets = np.arange(users + 1, dtype=np.int64) * 2  # two training items per user
    train = np.arange(2 * users, dtype=np.int64) % items
    return RawIds(np.arange(items) * 10 + 7, np.bincount(train, minlength=items), np.arange(users) + 100, (offsets, train))


@pytest.mark.parametrize("config", [TwoTowerConfig(dim=8, embedding_dim=8, user_layers=(8,), num_negatives=16), MFConfig(dim=8, loss="bpr")])
def test_retrieval_models_round_trip_with_their_raw_ids(tmp_path: Path, config: TwoTowerConfig | MFConfig) -> None:
    torch.manual_seed(0)
    model = build_model(config, optimizer=Adam(lr=0.01), num_users=6, num_items=9)
    ids = _retrieval_ids(6, 9)
    path = save_model(tmp_path / "model.pt", model, config, Adam(lr=0.01), ids=ids, extra={"note": 1})
    back = load_model(path, Family.RETRIEVAL)
    assert back.config == config and back.family is Family.RETRIEVAL and back.extra == {"note": 1}
    assert back.ids is not None and back.ids.users is not None and back.ids.train_csr is not None
    assert np.array_equal(back.ids.items, ids.items) and np.array_equal(back.ids.users, ids.users)
    assert np.array_equal(back.ids.train_csr[1], ids.train_csr[1])  # type: ignore[index]
    assert back.num_items == 9 and np.array_equal(back.item_counts, ids.item_counts)
    for k, v in model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k  # type: ignore[union-attr]
    assert not back.model.training  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"model\.pt holds a '\w+' model \(retrieval\), not a sequential one"):
        _ = back.max_len
    with pytest.raises(ValueError, match=r"save_model: 5 raw user ids, 9 raw item ids and 9 counts for 6 users and 9 items"):
        save_model(tmp_path / "bad.pt", model, config, Adam(), ids=RawIds(ids.items, ids.item_counts, ids.users[:5], ids.train_csr))
    with pytest.raises(ValueError, match="needs ids=RawIds"):
        save_model(tmp_path / "bad.pt", model, config, Adam())


def test_a_retrieval_model_file_carries_its_training_events_times(tmp_path: Path) -> None:
    """ids.train_times rides beside train_csr (the pipeline's interaction store keeps them); a file without them
    (written before they existed) reads as None; another length or a non-integer dtype is refused."""
    config = MFConfig(dim=8, loss="bpr")
    torch.manual_seed(0)
    model = build_model(config, optimizer=Adam(lr=0.01), num_users=6, num_items=9)
    ids = _retrieval_ids(6, 9)
    times = np.arange(12, dtype=np.int64) * 1_000 + 1_700_000_000
    timed = RawIds(ids.items, ids.item_counts, ids.users, ids.train_csr, times)
    back = load_model(save_model(tmp_path / "timed.pt", model, config, Adam(lr=0.01), ids=timed))
    assert back.ids is not None and back.ids.train_times is not None and back.ids.train_times.tolist() == times.tolist()
    assert load_model(save_model(tmp_path / "plain.pt", model, config, Adam(lr=0.01), ids=ids)).ids.train_times is None  # type: ignore[union-attr]
    for bad, message in ((times[:5], r"got int64 \[5\]"), (times.astype(np.float64), r"got float64 \[12\]")):
        with pytest.raises(ValueError, match=r"save_model: train_times must be integer seconds, one per item of train_csr \(12\), " + message):
            save_model(tmp_path / "bad.pt", model, config, Adam(lr=0.01), ids=RawIds(ids.items, ids.item_counts, ids.users, ids.train_csr, bad))
    saved = torch.load(tmp_path / "timed.pt", weights_only=True)
    saved["ids.train_times"] = saved["ids.train_times"][:3]
    torch.save(saved, tmp_path / "crafted.pt")
    with pytest.raises(ValueError, match=r"crafted\.pt is not a hugerec model file: ids.train_times holds 3 times for 12 training items"):
        load_model(tmp_path / "crafted.pt")


@pytest.mark.parametrize(
    "config",
    [
        SASRecConfig(max_len=6, dim=8),
        MLMConfig(max_len=6, dim=8, mask_prob=0.3),
        GRU4RecConfig(max_len=6, dim=8),
        HSTUConfig(max_len=6, dim=8, num_heads=2, time_buckets=5, temperature=0.05),
    ],
)
def test_sequential_models_round_trip_and_look_up_raw_ids(tmp_path: Path, config: SASRecConfig) -> None:
    torch.manual_seed(0)
    model = build_model(config, optimizer=Adam(lr=0.01), num_items=5)
    raw = np.array([11, 12, 15, 20, 31])
    path = save_model(tmp_path / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(raw, np.array([0, 3, 1, 1, 2, 5])))
    back = load_model(path)
    assert back.config == config and back.family is Family.SEQUENTIAL and back.max_len == 6 and back.num_items == 5
    assert back.lookup(np.array([15, 99, 11])).tolist() == [3, PAD, 1]
    seq = torch.tensor([[0, 1, 2, 3, 4, 5]])
    model.eval()
    with torch.no_grad():
        assert torch.equal(back.model(seq)[0], model(seq)[0])  # type: ignore[operator]
    with pytest.raises(ValueError, match="needs ids with I raw ids and I \\+ 1 counts, got 5 raw ids and 5 counts"):
        save_model(tmp_path / "bad.pt", model, config, Adam(), ids=RawIds(raw, np.ones(5)))


@pytest.mark.parametrize("config", [SASRecConfig(max_len=6, dim=8, num_layers=1), HSTUConfig(max_len=6, dim=8, num_layers=1)])
def test_a_sequential_model_trained_with_its_item_table_on_disk_loads_and_answers_as_trained(
    tmp_path: Path, config: SASRecConfig | HSTUConfig
) -> None:
    """The file holds the disk-tier table's rows and optimizer state (a loaded model's item table is in
    memory, whatever it was trained with): load_model, recommend_next, the next-items bundle export and
    hugerec.serving.load answer as the trained model, after the table's files are gone. The trained model's
    answers come from its twin trained with the table in memory (the same weights bit for bit:
    tests/training/test_sequential.py), since scoring the whole catalogue needs more rows than the cache."""
    num_items, raw = 40, np.arange(1000, 1120, 3, dtype=np.int64)  # dense item i is raw[i - 1]
    start = np.random.default_rng(0).integers(1, num_items + 1, 40)
    windows = (start[:, None] + np.arange(7)[None, :] - 1) % num_items + 1  # [40, 7] walks i, i + 1, ...
    family = SequentialFamily(SampledSoftmax(Negatives.IN_BATCH), item_counts=np.ones(num_items + 1))
    quiet = TrainConfig(epochs=1, lr=0.01, progress=False, tensorboard=False, plot=False)
    (tmp_path / "t").mkdir()
    trained = []
    for storage in ("memory", "disk"):
        torch.manual_seed(0)
        model = build_model(config, optimizer=Adam(lr=0.01), num_items=num_items)
        assert isinstance(model, SASRec | HSTU)
        table = item_table(model.cfg)
        if storage == "disk":
            table = dataclasses.replace(table, storage="disk", cache_rows=30, path=str(tmp_path / "t" / "item.rows"))
        model.lookup.items = EmbeddingCollection([table], Adam(lr=0.01))  # both draw their rows alike
        fit(model, window_batches(windows, 2), None, quiet, family=family)
        trained.append(model.eval())
    twin, model = trained
    rows = torch.arange(num_items + 2)
    trained_rows = model.lookup.items.read_rows("item", rows)
    histories = [np.array([3, 4, 5]), np.array([10]), np.arange(1, 20)]
    ref_items, ref_scores = recommend_next(twin, histories, k=5, exclude_history=True)
    path = save_model(tmp_path / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(raw, np.arange(num_items + 1)))
    bundle = export(path, tmp_path / "bundle", name="seq", k=5)
    shutil.rmtree(tmp_path / "t")  # the table's file and snapshots: the model file needs neither
    back = load_model(path, Family.SEQUENTIAL)
    assert isinstance(back.model, SASRec | HSTU) and not back.model.lookup.items.has_disk_tables
    loaded_rows = back.model.lookup.items.read_rows("item", rows)
    assert torch.equal(loaded_rows[0], trained_rows[0]) and torch.equal(loaded_rows[0], twin.lookup.items.read_rows("item", rows)[0])
    assert all(torch.equal(loaded_rows[1][k], v) for k, v in trained_rows[1].items())
    step = model.lookup.items.adam_step("item")
    assert step is not None and step > 0 and back.model.lookup.items.adam_step("item") == step
    assert all(torch.equal(a, b) for a, b in zip(back.model.parameters(), model.parameters(), strict=True))
    items, scores = recommend_next(back.model, histories, k=5, exclude_history=True)
    assert np.array_equal(items, ref_items) and np.array_equal(scores, ref_scores)
    served = load(bundle)
    try:
        out = served.next_items(np.concatenate([raw[h - 1] for h in histories]), np.array([len(h) for h in histories]))
    finally:
        served.close()
    np.testing.assert_array_equal(out["items"], raw[ref_items - 1])
    np.testing.assert_allclose(out["scores"], ref_scores, rtol=1e-5, atol=1e-5)


def test_an_hstu_built_with_other_options_than_its_config_is_refused(tmp_path: Path) -> None:
    config = HSTUConfig(max_len=6, dim=8, num_heads=2)
    model = HSTU(config.sequence_config(5), Adam(lr=0.01), HSTUOptions(temperature=0.05))  # the config says 0.0
    with pytest.raises(ValueError, match=r"save_model: the HSTU's HSTUOptions\(.*temperature=0.05\) was not built from HSTUConfig"):
        save_model(tmp_path / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(np.arange(5), np.ones(6)))


def test_a_file_of_another_family_is_one_line_naming_it(tmp_path: Path) -> None:
    path, _ = saved(tmp_path)
    with pytest.raises(ValueError, match=r"^load_model: .*model\.pt holds a 'dlrm' model \(ranking\), not a sequential one$"):
        load_model(path, Family.SEQUENTIAL)
    with pytest.raises(ValueError, match=r"model\.pt holds a 'dlrm' model \(ranking\): it has no item catalogue"):
        _ = load_model(path).num_items
    spec = json.loads(torch.load(path, weights_only=True)["spec"])
    torch.save({"spec": json.dumps({**spec, "family": "retrieval"}), "state": {}}, tmp_path / "lie.pt")
    with pytest.raises(ValueError, match="family 'retrieval' does not fit model type 'dlrm'"):
        load_model(tmp_path / "lie.pt")


def test_side_features_are_refused_not_lost(tmp_path: Path) -> None:
    from hugerec.models.two_tower import TwoTower
    from hugerec.sparse.jagged import JaggedTensor

    config = TwoTowerConfig(dim=4, embedding_dim=4, user_layers=(), user_features=(("age", 3),))
    feats = {"age": JaggedTensor(torch.tensor([0, 1, 2]), torch.tensor([1, 1, 1]))}
    model = TwoTower(config, 3, 4, user_features=feats)
    with pytest.raises(ValueError, match="side features is not saved yet"):
        save_model(tmp_path / "m.pt", model, config, Adam(), ids=_retrieval_ids(3, 4))


@pytest.mark.parametrize("library", ["lightgbm", "xgboost"])
def test_trees_round_trip_with_their_description(tmp_path: Path, library: str) -> None:
    pytest.importorskip(library)
    from hugerec.training.gbm_fit import fit_trees

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    labels = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(np.float32)
    data = FeatureMatrix(x, labels, ("a", "b", "c"), 3)
    config = LightGBMConfig(num_trees=5) if library == "lightgbm" else XGBoostConfig(num_trees=5)
    trees, _ = fit_trees(config, data, None, log_every=100)
    suffix = ".txt" if library == "lightgbm" else ".json"
    path = save_model(tmp_path / f"model{suffix}", trees, config, schema={"columns": []}, extra={"best_round": 5})
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert meta["family"] == "trees" and meta["model"]["type"] == library and meta["extra"] == {"best_round": 5}
    back = load_model(path, Family.TREES)
    assert back.config == config and back.schema == {"columns": []} and back.optimizer is None
    assert np.allclose(back.model.margin(x), trees.margin(x))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"holds a '\w+' model \(trees\), not a ranking one"):
        load_model(path, Family.RANKING)
    with pytest.raises(ValueError, match=r"must end in \.txt or \.json"):
        save_model(tmp_path / "model.pt", trees, config)
    path.with_suffix(".meta.json").unlink()
    with pytest.raises(ValueError, match=r"has no model\.meta\.json beside it"):
        load_model(path)
