"""HSTU: the jagged path against the padded one, causality, cached candidate scoring against full forwards, learning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.models.hstu import HSTU, HSTUConfig, HSTUOptions, Layout, RankingBatch, table_gather, time_buckets
from hugerec.models.sequence import PAD, SequenceConfig
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.sequential import FullSoftmax, SequentialFamily, next_item_metrics, window_batches
from hugerec.training.trainer import TrainConfig, fit

CFG = SequenceConfig(num_items=50, max_len=8, dim=16, num_layers=2, num_heads=2, dropout=0.0)


def _pair(options: HSTUOptions | None = None, cfg: SequenceConfig = CFG) -> tuple[HSTU, HSTU]:
    torch.manual_seed(0)
    jagged = HSTU(cfg, options=options).eval()
    with torch.no_grad():  # non-zero relative biases, so the test sees them
        for layer in jagged.blocks:
            layer.pos_bias.normal_()
            layer.time_bias.normal_()
    padded = HSTU(cfg, options=options, layout=Layout.PADDED).eval()
    padded.load_state_dict(jagged.state_dict())
    return jagged, padded


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_jagged_equals_padded(data: st.DataObject) -> None:
    """Rows of any length 0..L (B = 1 too), with and without timestamps, plain dot or cosine outputs."""
    temperature = data.draw(st.sampled_from([0.0, 0.1]))
    jagged, padded = _pair(HSTUOptions(temperature=temperature, attention_dim=data.draw(st.sampled_from([0, 3]))))
    b = data.draw(st.integers(1, 4))
    length = data.draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    seq = torch.randint(1, 51, (b, length), generator=g)
    for r in range(b):
        seq[r, : data.draw(st.integers(0, length))] = PAD
    times = torch.randint(0, 10**6, (b, length), generator=g).sort(dim=1).values if data.draw(st.booleans()) else None
    with torch.no_grad():
        hj, cj = jagged(seq, torch.tensor([1, 7]), times)
        hp, cp = padded(seq, torch.tensor([1, 7]), times)
    torch.testing.assert_close(hj, hp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cj, cp)
    assert bool((hj[seq == PAD] == 0).all())


def test_prediction_at_t_ignores_later_items_and_times() -> None:
    model, _ = _pair()
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(1, 51, (3, 8), generator=g)
    seq[0, :2] = PAD
    times = torch.arange(24).view(3, 8) * 1000
    with torch.no_grad():
        h, _ = model(seq, None, times)
        for t in range(2, 7):
            changed, later = seq.clone(), times.clone()
            changed[:, t + 1 :] = torch.randint(1, 51, changed[:, t + 1 :].shape, generator=g)
            later[:, t + 1 :] += 10**7
            h2, _ = model(changed, None, later)
            torch.testing.assert_close(h2[:, : t + 1], h[:, : t + 1])
            assert not torch.allclose(h2[:, t + 1 :], h[:, t + 1 :])


@pytest.mark.parametrize("layout", [Layout.JAGGED, Layout.PADDED])
def test_all_equal_times_add_one_constant_bucket(layout: Layout) -> None:
    """Every pair's time difference is 0 when the times are equal: bucket 0 everywhere, so the model equals
    the one without times whose position bias carries time_bias[0] (a constant bias for every pair)."""
    jagged, padded = _pair()
    model = jagged if layout is Layout.JAGGED else padded
    seq = torch.randint(1, 51, (3, 8), generator=torch.Generator().manual_seed(5))
    seq[1, :5] = PAD
    shifted = HSTU(CFG, layout=layout).eval()
    shifted.load_state_dict(model.state_dict())
    with torch.no_grad():
        for layer in shifted.blocks:
            layer.pos_bias += layer.time_bias[0]
        got, _ = model(seq, None, torch.full(seq.shape, 1_700_000_000))
        want, _ = shifted(seq)
    assert bool((time_buckets(torch.zeros(5, dtype=torch.int64), 64) == 0).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_hstu_config_times_is_a_bool() -> None:
    assert HSTUConfig(times=True).times and not HSTUConfig().times
    with pytest.raises(ValueError, match="HSTUConfig: times must be true or false, got 1"):
        HSTUConfig(times=1)  # type: ignore[arg-type]


def test_hstu_config_ranking_keys() -> None:
    assert HSTUConfig(ranking_weight=0.5).ranking_head_trained and not HSTUConfig().ranking_head_trained
    for bad in (-0.1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match=r"HSTUConfig: ranking_weight must be a finite number >= 0"):
            HSTUConfig(ranking_weight=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"HSTUConfig: ranking_negatives must be an int >= 1, got 0"):
        HSTUConfig(ranking_negatives=0)


@pytest.mark.parametrize("with_times", [False, True])
def test_forward_ranked_is_forward_and_the_ranking_loss_from_one_lookup(with_times: bool) -> None:
    """forward_ranked gives forward's outputs and candidate_ranking_loss's value (one item lookup for both);
    the ranking loss reads the history's times and the latest event's as the candidates' time, never the
    target's own time (changing it changes nothing), and a negative equal to the target is masked."""
    model, _ = _pair()
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(1, 51, (4, 8), generator=g)
    seq[2, :5] = PAD
    windows = torch.randint(1, 51, (4, 8), generator=g)  # [B, max_len]: 7 history items and the target
    windows[1, :6] = PAD  # one history item
    negatives = torch.randint(1, 51, (4, 5), generator=g)
    negatives[0, 2] = windows[0, -1]
    seq_t = torch.arange(32).view(4, 8) * 1000 if with_times else None
    win_t = torch.cumsum(torch.randint(1, 10**5, (4, 8), generator=g), dim=1) if with_times else None
    cand = torch.arange(1, 51)
    hidden, rows, loss = model.forward_ranked(seq, cand, seq_t, RankingBatch(windows, negatives, win_t))
    want_hidden, want_rows = model(seq, cand, seq_t)
    torch.testing.assert_close(hidden, want_hidden)
    torch.testing.assert_close(rows, want_rows)
    torch.testing.assert_close(loss, model.candidate_ranking_loss(windows, negatives, win_t))
    if with_times:
        assert win_t is not None
        later = win_t.clone()
        later[:, -1] += 10**8  # the target's own time
        torch.testing.assert_close(model.candidate_ranking_loss(windows, negatives, later), loss, rtol=0, atol=0)
        moved = win_t.clone()
        moved[:, -2] += 10**7  # the history's latest event: the candidates' time
        assert not torch.allclose(model.candidate_ranking_loss(windows, negatives, moved), loss)
    # masking: the duplicate of the target is no negative
    with torch.no_grad():
        logits = model.candidate_scores(windows[:, :-1], torch.cat([windows[:, -1:], negatives], dim=1),
                                        None if win_t is None else win_t[:, :-1], None if win_t is None else win_t[:, -2])
    logits[0, 3] = float("-inf")
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.int64)))


def test_time_buckets() -> None:
    got = time_buckets(torch.tensor([0, 1, -1, 2, 100, 10**9]), 64)
    assert got.tolist() == [0, 0, 0, int(np.log(2) / 0.301), int(np.log(100) / 0.301), 64]


@pytest.mark.parametrize("with_times", [False, True])
def test_cached_scoring_equals_one_forward_per_candidate(with_times: bool) -> None:
    """Candidates attend to the history and themselves: the cached micro-batches equal a full forward of
    [history, candidate] for each candidate, on both layouts; an empty history works too."""
    model, padded = _pair()
    g = torch.Generator().manual_seed(3)
    history = torch.randint(1, 51, (3, 6), generator=g)
    history[1, :4] = PAD
    history[2] = PAD  # a cold user: nothing to attend to but the candidate itself
    candidates = torch.randint(1, 51, (3, 10), generator=g)
    times = torch.arange(18).view(3, 6) * 500 if with_times else None
    now = torch.tensor([10**5, 10**4, 3]) if with_times else None
    with torch.no_grad():
        cached = model.candidate_scores(history, candidates, times, now, micro_batch=3)
        batched = model.candidate_scores_uncached(history, candidates, times, now)
        one_each = torch.stack([
            torch.cat([model.candidate_scores_uncached(history[r : r + 1], candidates[r : r + 1, c : c + 1],
                                                       None if times is None else times[r : r + 1], None if now is None else now[r : r + 1])
                       for c in range(10)], dim=1)[0]
            for r in range(3)
        ])
        on_padded = padded.candidate_scores_uncached(history, candidates, times, now)
    torch.testing.assert_close(cached, batched, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cached, one_each, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cached, on_padded, rtol=1e-4, atol=1e-5)
    # a candidate's score does not depend on the other candidates
    with torch.no_grad():
        alone = model.candidate_scores(history, candidates[:, 4:5], times, now)
    torch.testing.assert_close(alone[:, 0], cached[:, 4])


def test_cached_scoring_refuses_bad_input() -> None:
    model, _ = _pair()
    with pytest.raises(ValueError, match="no slot for the candidate"):
        model.candidate_scores(torch.ones(1, 8, dtype=torch.int64), torch.ones(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="both times and now"):
        model.candidate_scores(torch.ones(1, 3, dtype=torch.int64), torch.ones(1, 2, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[B, C\] = \[1, C\]"):
        model.candidate_scores(torch.ones(1, 3, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="exceed max_len 8"):
        model(torch.ones(1, 9, dtype=torch.int64))


def _chains(n: int, length: int, seed: int) -> np.ndarray:
    """Item i is followed by i + 1 (mod 50), from random starts: a next-item pattern a model must learn."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 50, n)
    return (start[:, None] + np.arange(length)[None, :]) % 50 + 1


@pytest.mark.parametrize(
    ("loss", "pipeline"), [(FullSoftmax(), False), (SampledSoftmax(negatives=Negatives.UNIFORM, num_negatives=16), True)]
)
def test_the_one_trainer_trains_hstu(loss: FullSoftmax | SampledSoftmax, pipeline: bool) -> None:
    """`fit` with the sequential family, as it trains SASRec (the pipeline stages the lookup a step ahead)."""
    torch.manual_seed(0)
    model = HSTU(CFG, options=HSTUOptions(temperature=0.1))
    windows = _chains(400, 9, 0)
    family = SequentialFamily(loss, item_counts=np.bincount(windows.ravel(), minlength=51))
    cfg = TrainConfig(epochs=6, lr=1e-2, pipeline=pipeline, progress=False, tensorboard=False, plot=False)
    batches = window_batches(windows, 32)
    history = fit(model, batches, None, cfg, family=family)
    assert history.steps == 6 * len(batches) and history.train[-1]["loss"] < history.train[0]["loss"]
    test = _chains(100, 9, 1)
    metrics = next_item_metrics(model, test[:, :-1], test[:, -1], ks=(1,))
    assert metrics["recall@1"] > 0.8


def test_ranking_head_learns_the_next_item() -> None:
    torch.manual_seed(0)
    model = HSTU(CFG, options=HSTUOptions(temperature=0.1))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    g = torch.Generator().manual_seed(0)
    windows = torch.from_numpy(_chains(256, 8, 0))
    model.train()
    for step in range(40):
        batch = windows[(step * 32) % 256 : (step * 32) % 256 + 32]
        loss = model.candidate_ranking_loss(batch, torch.randint(1, 51, (32, 8), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.train(False)
    test = torch.from_numpy(_chains(50, 8, 1))
    with torch.no_grad():
        scores = model.candidate_scores(test[:, :-1], torch.cat([test[:, -1:], torch.randint(1, 51, (50, 9), generator=g)], dim=1))
    assert float((scores.argmax(dim=1) == 0).float().mean()) > 0.8


def test_table_gather_matches_indexing_and_its_gradient() -> None:
    table = torch.randn(7, requires_grad=True)
    ref = table.detach().clone().requires_grad_()
    index = torch.randint(0, 7, (5, 40))
    grad = torch.randn(5, 40)
    out = table_gather(table, index)
    want = ref[index]
    torch.testing.assert_close(out, want)
    out.backward(grad)
    want.backward(grad)
    assert table.grad is not None and ref.grad is not None
    torch.testing.assert_close(table.grad, ref.grad)


# -- the item lookup staged a step ahead by the training pipeline ---------------------------------------------
def _staged_hstu(table: object, layout: Layout = Layout.JAGGED) -> HSTU:
    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.optimizers import Adam

    torch.manual_seed(0)
    model = HSTU(SequenceConfig(num_items=50, max_len=6, dim=8, num_layers=1, num_heads=2, dropout=0.1), Adam(lr=0.05), layout=layout)
    model.lookup.items = EmbeddingCollection([table], Adam(lr=0.05))  # type: ignore[list-item]
    return model


@pytest.mark.parametrize("ranking", [False, True])
def test_the_pipeline_stages_hstus_own_lookup_bit_for_bit(tmp_path: Path, ranking: bool) -> None:
    """HSTU looks up the items of seq without its padding (and, with a ranking head, the ranking pass's ids behind
    the candidates), not the [B, L] window: `lookup_features` prepares that very lookup, so the training pipeline
    stages it (a disk-tier table's rows a step ahead, a dynamic table's remap) and the step takes the staged rows.
    With the pipeline or without, disk and dynamic tables train the same weights bit for bit (the disk tier's as
    the in-memory table's), times and the ranking head included (before, a staged step was refused: the lookup
    never matched)."""
    import dataclasses

    from hugerec.embedding.table_config import DynamicConfig
    from hugerec.models.sequence import item_table

    memory = item_table(SequenceConfig(num_items=50, max_len=6, dim=8))
    disk = dataclasses.replace(memory, storage="disk", cache_rows=36, path=str(tmp_path / "items.rows"))  # evictions every few steps
    dynamic = dataclasses.replace(memory, num_rows=64, dynamic=DynamicConfig())
    windows = _chains(60, 7, 0)
    seconds = 1_700_000_000 + np.cumsum(np.random.default_rng(0).integers(0, 90_000, windows.shape), axis=1)
    family = SequentialFamily(SampledSoftmax(Negatives.IN_BATCH), item_counts=np.ones(51), times=True,
                              ranking_weight=0.5 if ranking else 0.0, ranking_negatives=2)
    cfg = TrainConfig(epochs=2, lr=0.01, log_every=3, progress=False, tensorboard=False, plot=False)

    def train(table: object, pipeline: bool) -> tuple[HSTU, dict[str, float]]:
        if table is disk:  # a file of its own per run
            table = dataclasses.replace(disk, path=str(tmp_path / f"items-{pipeline}.rows"))
        model = _staged_hstu(table)
        history = fit(model, window_batches(windows, 2, times=seconds), None, dataclasses.replace(cfg, pipeline=pipeline), family=family)
        return model, history.train[-1]

    ref, _ = train(memory, False)
    for pipeline in (False, True):
        got, last = train(disk, pipeline)
        assert ("prefetch_hidden" in last) == pipeline and 0 < last["cache_hit_rate"] < 1
        assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), got.parameters(), strict=True))
        for ids in torch.arange(1, 51).split(10):  # in parts: the disk tier's cache holds two lookups' rows
            assert torch.equal(ref.item_vectors(ids), got.item_vectors(ids))
    plain, _ = train(dynamic, False)  # a dynamic table hands rows out in first-seen order: against itself
    staged, last = train(dynamic, True)
    assert "prefetch_hidden" in last
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), staged.state_dict().values(), strict=True))


@pytest.mark.parametrize("layout", [Layout.JAGGED, Layout.PADDED])
def test_the_prepared_lookup_is_the_one_the_forward_takes(layout: Layout) -> None:
    """lookup_features(seq, candidates[, ranking]) is what forward / forward_ranked of those very tensors look up:
    staged in a dynamic table, the forward takes it (nothing is left staged, no other lookup is refused), the
    jagged layout without the padding (the table never sees the padding key)."""
    import dataclasses

    from hugerec.embedding.table_config import DynamicConfig
    from hugerec.models.sequence import item_table

    table = dataclasses.replace(item_table(SequenceConfig(num_items=50, max_len=6, dim=8)), num_rows=64, dynamic=DynamicConfig())
    model = _staged_hstu(table, layout)
    seq = torch.tensor([[0, 0, 3, 4, 5, 6], [0, 7, 8, 9, 10, 11]])
    cand = torch.tensor([12, 13])
    ranking = RankingBatch(torch.tensor([[0, 0, 0, 14, 15, 16]]), torch.tensor([[17, 18]]))
    for args in ((seq, cand), (seq, cand, ranking)):
        feats = model.lookup_features(*args)  # type: ignore[arg-type]
        collection = model.lookup.items
        collection.stage(feats, update=True)
        if len(args) == 2:
            hidden, rows = model(seq, cand)
        else:
            hidden, rows, _ = model.forward_ranked(seq, cand, None, ranking)
        assert not collection._staged and not model.lookup._prepared  # the staged lookup was taken
        assert hidden.shape == (2, 6, 8) and rows.shape == (2, 8)
        assert int(feats.lengths[0]) == (6 if layout is Layout.PADDED else int((seq != PAD).sum()))  # the first bag: a row, or every item
    padding_row = int(collection.hash_tables["item"].find(torch.tensor([PAD]))[0])
    assert (padding_row >= 0) == (layout is Layout.PADDED)  # the padding id is a key only where it is looked up
