import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.schema import Schema
from hugerec.data.synthetic import (
    Hotness,
    IdDistribution,
    SyntheticConfig,
    _amplitude,
    _AucHistogram,
    _bag_means,
    _Chunk,
    _draw_model,
    _latent,
    _parts,
    _sample_chunk,
    generate,
    id_effects,
    iter_tables,
    power_law_ids,
    preset,
)


def _small(**kw: object) -> SyntheticConfig:
    schema = Schema.build(dense=["d0", "d1"], sparse={"a": 50, "b": 1000, "m": 300}, multi_hot=["m"])
    base: dict[str, object] = dict(
        num_rows=5000, row_group_rows=1024, rows_per_file=2048, missing={"a": 0.2, "d0": 0.5}
    )
    base.update(kw)
    return SyntheticConfig(schema, **base)  # type: ignore[arg-type]


def test_generate_writes_shards_schema_and_report(tmp_path: Path) -> None:
    cfg = _small(column_hotness={"m": Hotness(2, 4)})
    report = generate(cfg, tmp_path)
    assert report.num_rows == 5000
    assert [p.name for p in report.paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in report.paths] == [2, 2, 1]
    assert Schema.load(tmp_path / "schema.json") == cfg.output_schema
    assert json.loads((tmp_path / "synthetic.json").read_text())["num_rows"] == 5000
    table = pq.read_table(report.paths)
    assert table.num_rows == 5000
    a = table["a"].to_numpy(zero_copy_only=False)
    assert 0.15 < table["a"].null_count / 5000 < 0.25
    assert np.nanmin(a) >= 0 and np.nanmax(a) < 50
    lens = np.array([len(x) for x in table["m"].to_pylist()])
    assert lens.min() == 2 and lens.max() == 4
    d0 = table["d0"].to_numpy()
    assert 0.4 < np.mean(d0 == 0) < 0.6 and np.all(d0 >= 0)
    labels = table["label"].to_numpy()
    assert set(np.unique(labels)) <= {0.0, 1.0}
    assert abs(report.positive_rate["label"] - 0.25) < 0.03
    assert 0.6 < report.oracle_auc["label"] < 1.0


def test_deterministic_and_independent_of_file_layout() -> None:
    t1 = list(iter_tables(_small(seed=3)))
    t2 = list(iter_tables(_small(seed=3, rows_per_file=4096)))
    t3 = list(iter_tables(_small(seed=4)))
    assert all(x.equals(y) for x, y in zip(t1, t2, strict=True))
    assert not t1[0].equals(t3[0])


def test_zipf_is_skewed_and_uniform_is_flat() -> None:
    zipf = next(iter_tables(_small(row_group_rows=4096, rows_per_file=4096, alpha=1.2)))
    flat = next(iter_tables(_small(row_group_rows=4096, rows_per_file=4096, distribution=IdDistribution.UNIFORM)))
    z = np.bincount(zipf["b"].to_numpy(), minlength=1000)
    u = np.bincount(flat["b"].to_numpy(), minlength=1000)
    assert z[0] > 20 * np.median(z)  # id 0 is the hottest
    assert u.max() < 5 * max(np.median(u), 1)


def test_presets() -> None:
    c = preset("criteo-like", 1000, seed=1)
    assert len(c.schema.dense) == 13 and len(c.schema.sparse) == 26
    assert c.schema["C3"].cardinality == 10131227 and c.missing["C22"] == 0.818 and c.seed == 1
    s = preset("seed-synthetic", 1000)
    assert len(s.schema.sparse) == 100 and s.hotness == Hotness(10)
    assert all(col.cardinality == 8192 and col.multi_hot for col in s.schema.sparse)
    table = next(iter_tables(preset("seed-synthetic", 64, row_group_rows=64, rows_per_file=64)))
    assert all(len(x) == 10 for x in table["f7"].to_pylist())
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset("nope", 10)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="needs dtype int and a cardinality"):
        SyntheticConfig(Schema.build(sparse=["x"]), 10)
    with pytest.raises(ValueError, match="unknown feature 'zz'"):
        _small(missing={"zz": 0.1})
    with pytest.raises(ValueError, match=r"missing rate of 'a' must be in \[0, 1\)"):
        _small(missing={"a": 1.0})
    with pytest.raises(ValueError, match="not multi-hot"):
        _small(column_hotness={"a": Hotness(2)})
    with pytest.raises(ValueError, match="low <= high"):
        Hotness(3, 2)
    with pytest.raises(ValueError, match="interaction_rank must be >= 1, got 0"):
        _small(interaction_rank=0)
    with pytest.raises(ValueError, match="head_ids must be > 0, got -1"):
        _small(head_ids=-1.0)


def _ref_hash(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _ref_unit(h: int) -> float:
    return (h >> 11) * 2.0**-53 * math.sqrt(12.0) - math.sqrt(3.0)


def _ref_effect(key: int, ids: np.ndarray) -> np.ndarray:
    return np.array([_ref_unit(_ref_hash(i ^ key)) for i in ids.tolist()])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 2**62), min_size=0, max_size=20),
    st.integers(0, 2**63 - 1),
    st.lists(st.integers(0, 4), min_size=1, max_size=6),
    st.integers(1, 5),
)
def test_effect_kernels_match_reference(ids: list[int], key: int, lengths: list[int], rank: int) -> None:
    arr = np.array(ids, dtype=np.int64)
    np.testing.assert_allclose(id_effects(np.uint64(key), arr), _ref_effect(key, arr), rtol=1e-12, atol=1e-12)
    ref_latent = np.array([[_ref_unit(_ref_hash(_ref_hash(i ^ key) ^ k)) for k in range(rank)] for i in ids])
    np.testing.assert_allclose(_latent(np.uint64(key), arr, rank), ref_latent.reshape(len(ids), rank), atol=1e-12)
    lens = np.array(lengths, dtype=np.int64)
    values = np.sin(np.arange(lens.sum(), dtype=np.float64))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    ref = np.array([values[s : s + n].mean() if n else 0.0 for s, n in zip(starts, lens, strict=True)])
    np.testing.assert_allclose(_bag_means(values, lens), ref, rtol=1e-9, atol=1e-12)


def test_tail_ids_carry_less_signal() -> None:
    ids = np.array([0, 100, 900, 10**6])
    np.testing.assert_allclose(_amplitude(_small(head_ids=100.0), ids), [1.0, 0.5**0.5, 0.1**0.5, (1 + 10**4) ** -0.5])
    np.testing.assert_allclose(_amplitude(_small(distribution=IdDistribution.UNIFORM), ids), 1.0)


def _all_pairs_chunk(cfg: SyntheticConfig) -> _Chunk:
    """Every (a, b) id pair of the two single-hot columns once, nothing missing."""
    a, b = np.meshgrid(np.arange(50), np.arange(50), indexing="ij")  # [50, 50] each
    n = a.size
    return _Chunk([a.ravel(), b.ravel()], [None, None], [np.ones(n, bool)] * 2, np.zeros((n, 0)))


@pytest.mark.parametrize("rank", [1, 3])
def test_interactions_are_low_rank_products_of_per_id_vectors(rank: int) -> None:
    schema = Schema.build(sparse={"a": 50, "b": 50})
    cfg = SyntheticConfig(schema, 100, num_interactions=1, interaction_rank=rank)
    model = _draw_model(cfg)
    _, pairwise, _ = _parts(cfg, model, model.tasks[0], _all_pairs_chunk(cfg))
    effects = pairwise.reshape(50, 50)  # [id of a, id of b]
    # generalises across pairs: the effect of (a, b) is <x_a, y_b>, learnable from a's and b's rows apart
    assert np.linalg.matrix_rank(effects, tol=1e-9) == rank


def test_calibration_splits_the_signal_and_hits_the_click_rate() -> None:
    cfg = preset("criteo-like", 1000, signal=1.5)
    model = _draw_model(cfg)
    chunk = _sample_chunk(cfg, model, np.random.default_rng(123), 1 << 15)  # rows the calibration never saw
    parts = _parts(cfg, model, model.tasks[0], chunk)
    shares = np.array([p.var() for p in parts]) / 1.5**2
    np.testing.assert_allclose(shares, [0.7, 0.15, 0.15], atol=0.05)
    logit = sum(parts) + model.tasks[0].bias
    assert abs(np.mean(1 / (1 + np.exp(-logit))) - cfg.positive_rate) < 0.01


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 10**7), st.floats(0.3, 2.5))
def test_power_law_ids_match_reference(cardinality: int, alpha: float) -> None:
    u = np.linspace(0.0, 1.0 - 1e-12, 101)
    got = power_law_ids(u, cardinality, alpha)
    e = 1.0 - alpha
    x = (
        np.exp(u * math.log(cardinality + 1.0))
        if abs(e) < 1e-9
        else (1 + u * ((cardinality + 1.0) ** e - 1)) ** (1 / e)
    )
    ref = np.clip(np.floor(x) - 1, 0, cardinality - 1)
    assert np.all(np.abs(got - ref) <= 1)  # floor of a few-ulp difference may land one id apart
    assert got.min() >= 0 and got.max() <= cardinality - 1
    assert np.all(np.diff(got) >= 0)  # inverse CDF: monotone in u


def test_auc_histogram_matches_exact_auc() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(5000)
    y = rng.random(5000) < p
    h = _AucHistogram()
    h.add(p, y)
    order = np.argsort(p)
    ranks = np.empty(5000)
    ranks[order] = np.arange(1, 5001)
    n_pos = int(y.sum())
    exact = (ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (5000 - n_pos))
    assert abs(h.auc() - exact) < 1e-3
