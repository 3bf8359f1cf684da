"""`hugerec pipeline build / query` as documented: a two-tower trained by `hugerec train`, item features
from a CSV, a DLRM ranking bundle; then the bundle is queried and served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.cli import main
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.export import export

RETRIEVAL = """
[interactions]
files = "ratings.dat"
columns = ["user", "item", "rating", "timestamp"]
separator = "::"
batch_size = 64
ks = [5]
[embedding]
optimizer = { type = "adam", lr = 0.01 }
[model]
type = "two_tower"
dim = 16
embedding_dim = 16
user_layers = [16]
num_negatives = 16
[train]
epochs = 1
max_steps = 4
out_dir = "run"
"""

PIPELINE = """
[inputs]
retrieval_model = "run/model.pt"
ranker_bundle = "ranker"
item_features = "items.csv"
index = "exact"
out = "pipe"

[pipeline]
name = "shop"
context = { hour = 12 }

[retrieve]
sources = [{ kind = "ann", k = 20 }, { kind = "item_to_item", k = 10 }, { kind = "popular", k = 10, cold_k = 25 }]

[filter]
keep = [{ column = "available", op = "==", value = 1 }]

[score]
dense = ["user.events", "item.count", "item.category", "context.hour"]
sparse = [["user", "user.id"], ["item", "item.id"], ["last_item", "item.category"]]

[order]
diversity = "category"
per_category = 2
max_k = 20
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rng = np.random.default_rng(0)
    lines = [f"{u}::{100 + int(i)}::3::{1_000_000 + u * 100 + t}" for u in range(1, 41) for t, i in enumerate(rng.integers(0, 30, 10))]
    (tmp_path / "ratings.dat").write_text("\n".join(lines) + "\n")
    (tmp_path / "two_tower.toml").write_text(RETRIEVAL)
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    items = ["item,available,category"] + [f"{100 + i},{int(i % 7 != 0)},{i % 4}" for i in range(30)]
    (tmp_path / "items.csv").write_text("\n".join(items) + "\n")
    torch.manual_seed(0)
    tables = [TableConfig("user", 300, 8), TableConfig("item", 200, 8, features=("item", "last_item"), pooling=Pooling.MEAN)]
    export(DLRM(EmbeddingCollection(tables), 4, [16, 8], [16, 1]).eval(), tmp_path / "ranker", name="ranker")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_build_query_and_bad_input(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml"]) == 0
    capsys.readouterr()
    assert main(["pipeline", "build", "pipeline.toml"]) == 0, capsys.readouterr().err
    assert "shop version 1 -> pipe" in capsys.readouterr().out
    assert main(["pipeline", "query", "pipe", "--user", "3", "--k", "6", "--context", "hour=8", "--debug"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["items"]) == 6 and list(out["stages"]) == ["retrieve", "filter", "score", "order"]
    assert all(i % 7 != 2 for i in out["items"])  # items 100 + 7j are unavailable
    assert all((i - 100) % 7 != 0 for i in out["stages"]["filter"]["items"])
    assert main(["pipeline", "query", "pipe", "--user", "999", "--k", "5", "--history", "101,102"]) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cold["cold_start"] and "item_to_item" in cold["sources"]
    assert main(["pipeline", "query", "pipe", "--user", "3", "--k", "21"]) == 2
    assert "field 'k' = 21 must be an integer in 1..20" in capsys.readouterr().err
    assert main(["pipeline", "query", "pipe", "--user", "3", "--context", "rain=1"]) == 2
    assert "unknown keys ['rain']" in capsys.readouterr().err
    assert main(["pipeline", "query", "ranker", "--user", "3"]) == 2  # the manifest's kind, checked before loading
    assert capsys.readouterr().err.strip() == (
        "hugerec pipeline query: error: ranker is a model bundle; pipeline query needs a pipeline bundle (hugerec pipeline build)"
    )
    (workdir / "bad.toml").write_text(PIPELINE.replace('op = "=="', 'op = "=>"'))
    assert main(["pipeline", "build", "bad.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.toml [filter] keep[0]: Condition: op must be one of" in err and "\n" not in err
    (workdir / "bad.toml").write_text(PIPELINE.replace('"item.count"', '"item.colour"'))
    assert main(["pipeline", "build", "bad.toml"]) == 2
    assert "no column 'colour'" in capsys.readouterr().err


def test_index_options_reach_the_hnsw_index_and_bad_ones_are_named(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml"]) == 0
    hnsw = PIPELINE.replace('index = "exact"', 'index = "hnsw"\nindex_options = { connectivity = 8, expansion_search = 64, dtype = "f16" }')
    (workdir / "hnsw.toml").write_text(hnsw)
    capsys.readouterr()
    assert main(["pipeline", "build", "hnsw.toml", "--print-config"]) == 0
    shown = json.loads(capsys.readouterr().out)["inputs"]
    assert shown["index_options"] == {"connectivity": 8, "dtype": "f16", "expansion_search": 64}
    assert main(["pipeline", "build", "hnsw.toml"]) == 0, capsys.readouterr().err
    saved = json.loads((workdir / "pipe" / "retrieval" / "index" / "index.json").read_text())
    assert {k: saved["config"][k] for k in ("kind", "connectivity", "expansion_search", "dtype")} == {
        "kind": "hnsw", "connectivity": 8, "expansion_search": 64, "dtype": "f16"}
    for options, message in [
        ("{ efSearch = 64 }", "index_options: unknown key 'efSearch'; known keys are"),
        ("{ expansion_search = 1 }", "index_options: IndexConfig: expansion_search must be >= 2, got 1"),
        ('{ dtype = "i8" }', "index_options: IndexConfig: dtype must be one of"),
        ('{ connectivity = "many" }', "index_options connectivity: got 'many', expected a number"),
        ("64", "index_options: must be a table"),
    ]:
        (workdir / "bad.toml").write_text(hnsw.replace('{ connectivity = 8, expansion_search = 64, dtype = "f16" }', options))
        assert main(["pipeline", "build", "bad.toml"]) == 2
        err = capsys.readouterr().err.strip()
        assert "bad.toml [inputs] " in err and message in err and "\n" not in err, err


HSTU = """
[preprocess]
input = "ratings.dat"
format = "csv"
separator = "::"
header = false
columns = [
  { name = "user", type = "int", role = "user" },
  { name = "item", type = "int", role = "item" },
  { name = "rating", type = "int", role = "none" },
  { name = "timestamp", type = "timestamp" },
]
[sequences]
protocol = "leave_last_out"
batch_size = 32
ks = [5]
[embedding]
optimizer = { type = "adam", lr = 0.003 }
[model]
type = "hstu"
max_len = 6
dim = 16
num_heads = 2
times = true
ranking_weight = 1.0
[train]
epochs = 1
max_steps = 4
out_dir = "hstu_run"
"""

TIMED_PIPELINE = """
[inputs]
retrieval_model = "run/model.pt"
sequential_bundle = "hstu_run/bundle"
index = "exact"
out = "timed_pipe"

[pipeline]
name = "timed"

[retrieve]
sources = [{ kind = "ann", k = 10 }, { kind = "sequential", k = 10 }, { kind = "popular", k = 10, cold_k = 20 }]

[score]
sequential = true

[order]
max_k = 20
"""


def test_a_pipeline_of_an_hstu_trained_with_times_builds_and_answers_with_them(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As configs/movielens_hstu_pipeline.toml says: a two-tower and an HSTU trained with model.times = true by
    `hugerec train`, the HSTU exported, `hugerec pipeline build`: the store keeps the training events' times
    (the retrieval model file carries them), the pipeline's Score ranks with the stored times, `pipeline query`
    takes --history-times (refused in one line without them); a model file written before it carried times is
    refused at build naming the stage and the bundle."""
    from hugerec.serving.bundles.next_items_bundle import load_next_items
    from hugerec.training.model_file import load_model

    (workdir / "hstu.toml").write_text(HSTU)
    (workdir / "timed.toml").write_text(TIMED_PIPELINE)
    assert main(["train", "two_tower.toml"]) == 0
    assert main(["train", "hstu.toml"]) == 0
    assert main(["export", "hstu.toml"]) == 0
    capsys.readouterr()
    assert main(["pipeline", "build", "timed.toml"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    with np.load(workdir / "timed_pipe" / "interactions.npz") as saved:
        users, offsets, times = saved["users"], saved["offsets"], saved["times"]
    user = int(users[2])
    # the ratings file: user u's t-th rating at 1_000_000 + 100 u + t; the last one of each user is held out
    assert times[offsets[2] : offsets[3]].tolist() == [1_000_000 + 100 * user + t for t in range(9)]
    assert main(["pipeline", "query", "timed_pipe", "--user", str(user), "--k", "5", "--debug"]) == 0
    out = json.loads(capsys.readouterr().out)
    seq = load_next_items(workdir / "hstu_run" / "bundle")
    ids = load_model(workdir / "run" / "model.pt").ids
    assert ids is not None and ids.train_csr is not None and ids.users is not None
    row = int(np.searchsorted(ids.users, user))
    history = ids.items[ids.train_csr[1][ids.train_csr[0][row] : ids.train_csr[0][row + 1]]]
    cands = np.array(out["stages"]["retrieve"]["items"])
    logits, _ = seq.candidate_scores(history, cands, times=times[offsets[2] : offsets[3]])
    assert out["items"] == cands[np.lexsort((cands, -logits))][:5].tolist()
    args = ["pipeline", "query", "timed_pipe", "--user", str(user), "--k", "5", "--history", "101,102"]
    assert main(args) == 2
    assert "field 'history.times' is required with a history" in capsys.readouterr().err
    assert main([*args, "--history-times", f"{2_000_000},{2_000_060}"]) == 0
    capsys.readouterr()
    assert main([*args, "--history-times", "5,6"]) == 2
    assert "field 'history.times[0]' = 5 is earlier than user" in capsys.readouterr().err
    assert main([*args, "--history-times", "1," + "9" * 30]) == 2
    assert "--history-times: '999999999999999999999999999999' is not an integer within int64" in capsys.readouterr().err
    # model.ranking_weight: kept in the model file and the run's settings (a resume cannot change it); an HSTU
    # trained without it serves next items, but the Score stage over it is refused at build in one line
    assert load_model(workdir / "hstu_run" / "model.pt").config.ranking_weight == 1.0  # type: ignore[union-attr]  # an HSTUConfig
    assert main(["train", "hstu.toml", "train.resume=true", "model.ranking_weight=0.5"]) == 2
    assert "family.ranking_weight: 1.0 -> 0.5" in capsys.readouterr().err
    assert main(["train", "hstu.toml", "model.ranking_weight=0"]) == 0
    assert main(["export", "hstu.toml", "model.ranking_weight=0"]) == 0
    capsys.readouterr()
    assert main(["pipeline", "build", "timed.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Score with sequential = 'ranking_head' uses next-items bundle 'hstu', an HSTU whose ranking head was never trained; train it with model.ranking_weight > 0" in err
    assert "\n" not in err
    # the same HSTU ranks by its next-item score (no head needed), as configs/movielens_hstu_pipeline.toml does
    (workdir / "next.toml").write_text(TIMED_PIPELINE.replace("sequential = true", 'sequential = "next_item"').replace('out = "timed_pipe"', 'out = "next_pipe"'))
    assert main(["pipeline", "build", "next.toml"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["pipeline", "query", "next_pipe", "--user", str(user), "--k", "5", "--debug"]) == 0
    out = json.loads(capsys.readouterr().out)
    seq = load_next_items(workdir / "hstu_run" / "bundle")
    cands = np.array(out["stages"]["retrieve"]["items"])
    logits, _ = seq.next_item_scores(history, cands, times=times[offsets[2] : offsets[3]])
    assert out["items"] == cands[np.lexsort((cands, -logits))][:5].tolist()
    # a retrieval model file written before it carried the training events' times
    import torch as _torch

    saved_model = _torch.load(workdir / "run" / "model.pt", weights_only=True)
    del saved_model["ids.train_times"]
    _torch.save(saved_model, workdir / "run" / "model.pt")
    assert main(["pipeline", "build", "timed.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "source 'sequential' uses next-items bundle 'hstu', an HSTU trained with model.times = true, but the interaction store keeps no event times" in err
    assert "\n" not in err
