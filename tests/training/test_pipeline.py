"""The training pipeline: batch i + 1 staged while step i runs, bit for bit the plain loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import DynamicConfig, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.pipeline import Pipeline
from hugerec.training.trainer import TrainConfig, fit

ROWS = 50


def tables(tmp: Path | None, cache: int) -> list[TableConfig]:
    """u: static, i: dynamic (raw keys); both on disk when tmp is given."""

    def disk(name: str) -> dict[str, Any]:
        return {} if tmp is None else {"storage": "disk", "cache_rows": cache, "path": str(tmp / f"{name}.rows")}

    return [
        TableConfig("u", num_rows=ROWS, dim=4, **disk("u")),
        TableConfig("i", num_rows=ROWS, dim=4, dynamic=DynamicConfig(), **disk("i")),
    ]


def make_batches(n: int, batch: int = 8, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        u = rng.integers(0, ROWS, batch)
        i = rng.integers(0, 30, batch) * 1_000_003 + 11  # 30 raw keys: no eviction in the 50-row hash map
        sparse = SparseFeatures.from_dense({"u": torch.from_numpy(u), "i": torch.from_numpy(i)})
        dense = torch.from_numpy(rng.normal(size=(batch, 3)).astype(np.float32))
        labels = torch.from_numpy((rng.random(batch) < 0.5).astype(np.float32))
        out.append(Batch(dense, sparse, labels))
    return out


def model(tmp: Path | None, cache: int = 16) -> DLRM:
    torch.manual_seed(0)
    return DLRM(EmbeddingCollection(tables(tmp, cache), optimizer=Adam(lr=0.05)), 3, [8, 4], [8, 1])


def rows(m: DLRM) -> list[torch.Tensor]:
    emb = m.embedding_collections()[0]
    out = []
    for t in emb.tables:
        w, s = emb.read_rows(t.name, torch.arange(t.num_rows))
        out += [w, *s.values()]
    return out


def quiet(**kw: Any) -> TrainConfig:
    return TrainConfig(progress=False, tensorboard=False, plot=False, log_every=5, **kw)


def test_prefetch_between_forward_and_backward_changes_nothing(tmp_path: Path) -> None:
    """Batch i + 1 staged (hash remap, disk rows loaded, evictions) between step i's lookup and its
    update, with a cache of two batches' rows, so every batch evicts: the in-memory tables' result."""
    data = make_batches(30)
    mem, disk = model(None), model(tmp_path, cache=16)
    for b in data:
        loss = mem(b).sum()
        loss.backward()
    emb = disk.embedding_collections()[0]
    emb.stage(data[0].sparse, update=True)
    for i, b in enumerate(data):
        loss = disk(b).sum()
        if i + 1 < len(data):
            emb.stage(data[i + 1].sparse, update=True)
        loss.backward()
    assert all(torch.equal(x, y) for x, y in zip(rows(mem), rows(disk), strict=True))
    assert emb.disk_stats()["rows_written"] > 0


@pytest.mark.parametrize("pipeline", [False, True])
def test_fit_with_disk_tables_is_the_in_memory_run(tmp_path: Path, pipeline: bool) -> None:
    data = make_batches(24)
    mem = model(None)
    fit(mem, data, config=quiet(pipeline=False, seed=None))
    disk = model(tmp_path, cache=16)
    history = fit(disk, data, config=quiet(pipeline=pipeline, seed=None))
    assert all(torch.equal(x, y) for x, y in zip(rows(mem), rows(disk), strict=True))
    assert all(torch.equal(x, y) for x, y in zip(mem.parameters(), disk.parameters(), strict=True))
    last = history.train[-1]
    assert 0 < last["cache_hit_rate"] < 1 and last["disk_rows_read"] > 0
    assert ("prefetch_hidden" in last) == pipeline
    # the progress bar shows the same per-step figures
    from hugerec.training.trainer import _postfix

    bar = _postfix(history, "auc")
    assert f"hit={last['cache_hit_rate']:.0%} read={last['disk_rows_read']:,.0f} wrote=" in bar
    assert ("prefetch=" in bar and f"hidden={last['prefetch_hidden']:.0%}" in bar) == pipeline


def test_resume_with_pipeline_and_disk_tables(tmp_path: Path) -> None:
    """Checkpoints every 5 steps (the pipeline holds the next batch back), killed-and-resumed == straight."""
    data = make_batches(20)
    (tmp_path / "a").mkdir()
    straight = model(tmp_path / "a", cache=16)
    fit(straight, data, config=quiet(seed=None, out_dir=str(tmp_path / "run_a"), checkpoint_every=5))
    (tmp_path / "b").mkdir()
    first = model(tmp_path / "b", cache=16)
    fit(first, data, config=quiet(seed=None, out_dir=str(tmp_path / "run_b"), checkpoint_every=5, max_steps=10))
    again = model(tmp_path / "b", cache=16)
    fit(again, data, config=quiet(seed=None, out_dir=str(tmp_path / "run_b"), checkpoint_every=5, resume=True))
    assert all(torch.equal(x, y) for x, y in zip(rows(straight), rows(again), strict=True))


def test_pipeline_stops_cleanly_and_reports() -> None:
    m = model(None)
    m.train()
    pipe = Pipeline(m, torch.device("cpu"))
    for seen, b in enumerate(pipe(make_batches(5)), start=1):
        m(b).sum().backward()
        if seen == 3:
            break  # batch 4 was staged: it is forgotten, a later lookup of another batch works
    m(make_batches(1, seed=9)[0]).sum().backward()
    stats = pipe.stats()
    assert stats["prepare_s"] > 0 and 0 <= stats["hidden"] <= 1
    emb = m.embedding_collections()[0]
    emb.stage(make_batches(1, seed=3)[0].sparse, update=True)
    with pytest.raises(ValueError, match="TrainConfig\\(pipeline=False\\)"):
        m(make_batches(1, seed=4)[0])


def test_eval_with_staged_model_unaffected() -> None:
    """fit evaluates between steps with eval_every: the pipeline holds the next batch back meanwhile."""
    data = make_batches(12)
    a, b = model(None), model(None)
    ha = fit(a, data, data[:3], config=quiet(pipeline=True, seed=None, eval_every=4))
    hb = fit(b, data, data[:3], config=quiet(pipeline=False, seed=None, eval_every=4))
    assert [e["auc"] for e in ha.evals] == [e["auc"] for e in hb.evals]
    assert all(torch.equal(x, y) for x, y in zip(rows(a), rows(b), strict=True))
