"""Vector indexes: exact == brute force, HNSW recall vs exact, save/load round trips, add/remove, errors,
and the import order the package uses (torch, Numba's threading layer active, then usearch) in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.index.vector_index import ExactIndex, HnswIndex, IndexConfig, IndexKind, build_index, load_index


def _data(n: int = 2000, d: int = 16, q: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # clustered vectors, like trained item embeddings
    centers = torch.randn(20, d, generator=g)
    items = centers[torch.randint(0, 20, (n,), generator=g)] + 0.5 * torch.randn(n, d, generator=g)
    return items, torch.randn(q, d, generator=g)


def test_exact_matches_brute_force_with_custom_ids() -> None:
    items, queries = _data()
    ids = torch.arange(items.shape[0]) * 7 + 3
    index = build_index(items, ids)
    scores, got = index.query(queries, 10)
    brute = queries @ items.T
    want_scores, want_pos = torch.topk(brute, 10, dim=1)
    torch.testing.assert_close(scores, want_scores)
    assert torch.equal(got, ids[want_pos])


def test_hnsw_recall_against_exact() -> None:
    items, queries = _data(n=5000)
    exact = build_index(items)
    approx = build_index(items, config=IndexConfig(IndexKind.HNSW))
    _, e = exact.query(queries, 100)
    s, a = approx.query(queries, 100)
    recall = np.mean([len(set(x.tolist()) & set(y.tolist())) / 100 for x, y in zip(e, a, strict=True)])
    assert recall >= 0.95
    # the returned scores are the true inner products of the returned ids
    torch.testing.assert_close(s, (queries[:, None, :] * items[a]).sum(-1), rtol=1e-3, atol=1e-3)


def _latent(n: int, q: int, d: int = 32, rank: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Item and query vectors like a trained retrieval model's: low rank, a popularity direction, a small residual."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, rank + 1)))
    pop = -np.log(rng.permutation(n) + 1.0)
    items = np.c_[rng.standard_normal((n, rank)), pop - pop.mean()] @ basis.T + 0.05 * rng.standard_normal((n, d))
    queries = np.c_[2 * rng.standard_normal((q, rank)), np.ones(q)] @ basis.T + 0.05 * rng.standard_normal((q, d))
    return items.astype(np.float32), queries.astype(np.float32)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_hnsw_recall_of_many_neighbours_against_exact(dtype: str) -> None:
    """Retrieval asks HNSW for hundreds of neighbours: recall@200 against exact grows with expansion_search
    (at ef = k the search list is exactly k long and loses the boundary), and f16 storage keeps it."""
    items, queries = _latent(6000, 30)
    _, exact = build_index(items).query(queries, 200)
    index = build_index(items, config=IndexConfig(IndexKind.HNSW, connectivity=16, expansion_add=64, expansion_search=200, dtype=dtype))
    recalls = []
    for ef in (200, 800):
        index.set_expansion_search(ef)
        s, got = index.query(queries, 200)
        recalls.append(np.mean([len(set(x.tolist()) & set(y.tolist())) / 200 for x, y in zip(exact, got, strict=True)]))
        # the scores are the inner products of the ids returned (f16: computed from the half-precision vectors)
        tol = 1e-3 if dtype == "f32" else 3e-2
        torch.testing.assert_close(s, torch.from_numpy((queries[:, None, :] * items[got.numpy()]).sum(-1)), rtol=tol, atol=tol)
    assert recalls[1] >= 0.97 and recalls[1] > recalls[0], recalls
    assert index.config.expansion_search == 800


def test_index_config_dtype_is_checked_and_saved(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dtype must be one of \['f32', 'f16'\], got 'i8'"):
        IndexConfig(IndexKind.HNSW, dtype="i8")
    items, queries = _latent(500, 5)
    index = build_index(items, config=IndexConfig(IndexKind.HNSW, dtype="f16", expansion_search=64))
    loaded = load_index(index.save(tmp_path / "ix"))
    assert isinstance(loaded, HnswIndex) and loaded.config.dtype == "f16" and loaded.config.expansion_search == 64
    assert torch.equal(loaded.query(queries, 10)[1], index.query(queries, 10)[1])
    with pytest.raises(ValueError, match="expansion_search must be >= 2, got 1"):
        loaded.set_expansion_search(1)


@pytest.mark.parametrize("kind", list(IndexKind))
def test_save_load_round_trip_is_exact(kind: IndexKind, tmp_path: Path) -> None:
    items, queries = _data(n=1500)
    index = build_index(items, torch.arange(1500) + 10, IndexConfig(kind))
    index.remove(torch.tensor([10, 11, 500]))
    before = index.query(queries, 20)
    loaded = load_index(index.save(tmp_path / "ix"))
    assert type(loaded) is type(index) and len(loaded) == 1497 and loaded.dim == 16
    after = loaded.query(queries, 20)
    assert torch.equal(before[1], after[1]) and torch.equal(before[0], after[0])
    assert np.array_equal(loaded.ids(), index.ids())


@pytest.mark.parametrize("kind", list(IndexKind))
def test_add_remove_and_errors(kind: IndexKind) -> None:
    items, _ = _data(n=100, d=8)
    index = build_index(items[:50], config=IndexConfig(kind))
    index.add(torch.arange(50, 100), items[50:])
    assert len(index) == 100
    index.remove(np.array([0, 99]))
    _, top = index.query(items[:1], 98)
    assert set(top[0].tolist()) == set(range(1, 99))
    with pytest.raises(ValueError, match="dim 8"):
        index.query(torch.randn(2, 9), 5)
    with pytest.raises(ValueError, match="dim 8"):
        index.add(torch.tensor([500]), torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"k = 99 must be in 1\.\.98"):
        index.query(items[:1], 99)
    with pytest.raises(ValueError, match="id 5 is already"):
        index.add(torch.tensor([5]), items[:1])
    with pytest.raises(ValueError, match="id 0 is not in the index"):
        index.remove(torch.tensor([0]))
    with pytest.raises(ValueError, match="NaN"):
        index.add(torch.tensor([1000]), torch.full((1, 8), float("nan")))


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a saved index folder"):
        load_index(tmp_path)
    ExactIndex(4).save(tmp_path / "a")
    meta = tmp_path / "a" / "index.json"
    meta.write_text(meta.read_text().replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(ValueError, match="format_version 99"):
        load_index(tmp_path / "a")
    with pytest.raises(ValueError, match="kind must be one of"):
        IndexConfig("ivf")  # type: ignore[arg-type]  # config strings are what files give


def test_import_order_with_torch_and_numba_threads() -> None:
    """hugerec (torch + Numba kernels running on their threading layer) first, then the index (usearch)."""
    code = """
import torch, numba
import hugerec as hr
emb = hr.EmbeddingCollection([hr.TableConfig("t", num_rows=1000, dim=8)])
f = hr.sparse.SparseFeatures(("t",), torch.randint(0, 1000, (4096,)), torch.ones(4096, dtype=torch.int32))
emb(f).values.sum().backward()                     # Numba lookup + backward kernels
torch.set_num_threads(2); (torch.randn(512, 512) @ torch.randn(512, 512)).sum()  # torch's OpenMP pool
from hugerec.index import IndexConfig, build_index
ix = build_index(torch.randn(3000, 16), config=IndexConfig("hnsw"))
s, i = ix.query(torch.randn(64, 16), 10)
emb(f).values.sum().backward()                     # Numba again after usearch's threads ran
print("ok", numba.threading_layer(), i.shape[0])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")


def test_an_hnsw_build_on_one_thread_gives_the_same_graph_every_time(tmp_path: Path) -> None:
    """build_threads = 1: the same vectors, the same graph (a parallel build's depends on how its threads interleave):
    two builds answer alike and save the same bytes; the setting is checked and saved with the index."""
    items, queries = _latent(1500, 40)
    config = IndexConfig(IndexKind.HNSW, build_threads=1)
    first, second = build_index(items, config=config), build_index(items, config=config)
    for a, b in zip(first.query(queries, 100), second.query(queries, 100), strict=True):
        assert torch.equal(a, b)
    first.save(tmp_path / "a")
    second.save(tmp_path / "b")
    assert (tmp_path / "a" / "hnsw.usearch").read_bytes() == (tmp_path / "b" / "hnsw.usearch").read_bytes()
    assert load_index(tmp_path / "a").config.build_threads == 1
    with pytest.raises(ValueError, match=r"build_threads must be an integer >= 0 \(0: every core\), got -1"):
        IndexConfig(IndexKind.HNSW, build_threads=-1)
