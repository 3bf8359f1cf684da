"""The sequential family of the one trainer: the models learn a deterministic chain with every loss;
early stopping on recall@K; dynamic and disk-tier item tables with and without the pipeline, bit for
bit; recommend_next; errors; HSTU's timestamps through the family (TimedWindows): the step against a
padded reference, padding times ignored, resume to the bit, the refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.sessions import Sequences, last_n
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import DynamicConfig
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, Layout
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, SequenceConfig, item_table
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.family import StepContext
from hugerec.training.losses import Negatives, SampledSoftmax, full_softmax
from hugerec.training.sequential import (
    BCE,
    FullSoftmax,
    NextItemValidation,
    SequentialFamily,
    TimedWindows,
    next_item_metrics,
    query_vectors,
    recommend_next,
    window_batches,
    window_width,
)
from hugerec.training.trainer import TrainConfig, fit

NUM_ITEMS = 40


def _chains(n: int, length: int, seed: int) -> Sequences:
    """Sequences following item i -> i % NUM_ITEMS + 1: the next item is a function of the last one."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(1, NUM_ITEMS + 1, n)
    items = (starts[:, None] - 1 + np.arange(length)[None, :]) % NUM_ITEMS + 1
    return Sequences(np.arange(n), np.arange(0, n * length + 1, length), items.reshape(-1), np.zeros(n * length, np.int64))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_type", "loss"),
    [
        (SASRec, FullSoftmax()),
        (SASRec, SampledSoftmax(negatives=Negatives.MIXED, num_negatives=16, alpha=0.5)),
        (SASRec, BCE()),
        (GRU4Rec, FullSoftmax()),
        (MaskedTransformer, FullSoftmax()),
    ],
)
def test_models_learn_a_deterministic_chain(model_type: type[SASRec], loss: FullSoftmax | SampledSoftmax | BCE) -> None:
    torch.manual_seed(0)
    cfg = SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=32, num_layers=1, num_heads=1, dropout=0.0)
    model = model_type(cfg, optimizer=Adam(lr=0.02))
    train = _chains(120, 7, seed=0)
    counts = np.bincount(train.items, minlength=NUM_ITEMS + 1)
    family = SequentialFamily(loss, item_counts=counts)
    cfg = TrainConfig(epochs=12, lr=0.01, log_every=5, progress=False, tensorboard=False, plot=False)
    history = fit(model, window_batches(last_n(train, window_width(model)), 24), None, cfg, family=family)
    assert history.steps == 12 * 5 and history.train[-1]["loss"] < history.train[0]["loss"]
    test = _chains(50, 6, seed=1)
    hist = test.items.reshape(50, 6)[:, :5]
    targets = test.items.reshape(50, 6)[:, 5]
    m = next_item_metrics(model, np.pad(hist, ((0, 0), (1, 0))), targets, ks=(1, 10))
    assert m["recall@10"] > 0.9, m  # popularity would give 10 / 40


def test_recommend_next_truncates_and_rejects_empty_histories() -> None:
    torch.manual_seed(0)
    cfg = SequenceConfig(num_items=NUM_ITEMS, max_len=4, dim=8, num_layers=1, dropout=0.0)
    model = SASRec(cfg)
    long = np.arange(1, 11)  # 10 items, the model sees the last 4
    items, scores = recommend_next(model, [long, long[-4:]], k=5)
    assert items.shape == (2, 5) and (items[0] == items[1]).all()
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()
    excl, _ = recommend_next(model, [long], k=NUM_ITEMS - 10, exclude_history=True)
    assert not set(excl[0].tolist()) & set(long.tolist())
    with pytest.raises(ValueError, match="history 1 is empty"):
        recommend_next(model, [long, np.array([], dtype=np.int64)])
    with pytest.raises(ValueError, match=r"item ids must be in 1..40, got range 1..41"):
        recommend_next(model, [np.array([1, 41])])


def _validation(n: int, seed: int) -> NextItemValidation:
    test = _chains(n, 6, seed=seed)
    return NextItemValidation(np.pad(test.items.reshape(n, 6)[:, :5], ((0, 0), (1, 0))), test.items.reshape(n, 6)[:, 5])


def test_early_stopping_on_recall_restores_the_best(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Early stopping on recall@5 keeps the best epoch's weights; progress bar, metrics.jsonl, TensorBoard, curves.png."""
    torch.manual_seed(0)
    model = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=16, num_layers=1, dropout=0.0), optimizer=Adam(lr=0.5))
    es = EarlyStopping(patience=1, min_delta=0.0, restore_best=True)
    cfg = TrainConfig(epochs=10, lr=0.05, early_stopping=es, out_dir=str(tmp_path))
    valid = _validation(40, 1)
    history = fit(model, window_batches(last_n(_chains(60, 7, 0), 7), 20), valid, cfg, family=SequentialFamily(ks=(5,)))
    assert history.best_eval is not None and history.best_eval["recall@5"] == max(r["recall@5"] for r in history.evals)
    assert next_item_metrics(model, valid.histories, valid.targets, ks=(5,))["recall@5"] == history.best_eval["recall@5"]
    assert history.stopped_early == (len(history.evals) < 10) and (tmp_path / "curves.png").is_file()
    assert f"recall@5={history.evals[-1]['recall@5']:.4f}" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text().count('"recall@5"') == len(history.evals)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def _sasrec(table: Any, seed: int) -> SASRec:
    torch.manual_seed(seed)
    model = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8, num_layers=1, dropout=0.1), optimizer=Adam(lr=0.05))
    model.lookup.items = EmbeddingCollection([table], Adam(lr=0.05))
    return model


@pytest.mark.parametrize("pipeline", [False, True])
def test_dynamic_and_disk_item_tables_train_bit_for_bit(tmp_path: Path, pipeline: bool) -> None:
    """The item table on disk (a cache of about two batches' rows: evictions every step) or dynamic (raw
    keys through the hash map), staged a step ahead by the pipeline or not: the in-memory table's
    weights, with dropout drawing from the global stream in between."""
    memory = item_table(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8))
    disk = dataclasses.replace(memory, storage="disk", cache_rows=30, path=str(tmp_path / "items.rows"))
    dynamic = dataclasses.replace(memory, num_rows=64, dynamic=DynamicConfig())
    train = _chains(60, 7, seed=0)
    family = SequentialFamily(SampledSoftmax(Negatives.IN_BATCH), item_counts=np.ones(NUM_ITEMS + 1))
    cfg = TrainConfig(epochs=2, lr=0.01, log_every=3, progress=False, tensorboard=False, plot=False)
    no_pipeline = dataclasses.replace(cfg, pipeline=False)
    ref = _sasrec(memory, 0)
    fit(ref, window_batches(last_n(train, 7), 2), None, no_pipeline, family=family)
    got = _sasrec(disk, 0)
    history = fit(got, window_batches(last_n(train, 7), 2), None, dataclasses.replace(cfg, pipeline=pipeline), family=family)
    assert ("prefetch_hidden" in history.train[-1]) == pipeline and 0 < history.train[-1]["cache_hit_rate"] < 1
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), got.parameters(), strict=True))
    for ids in torch.arange(1, NUM_ITEMS + 1).split(10):
        assert torch.equal(ref.item_vectors(ids), got.item_vectors(ids))
    # a dynamic table hands rows out in first-seen order: compare it with itself without the pipeline
    plain, staged = _sasrec(dynamic, 0), _sasrec(dynamic, 0)
    fit(plain, window_batches(last_n(train, 7), 2), None, no_pipeline, family=family)
    fit(staged, window_batches(last_n(train, 7), 2), None, dataclasses.replace(cfg, pipeline=pipeline), family=family)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), staged.state_dict().values(), strict=True))


def test_family_and_window_errors() -> None:
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        window_batches(np.ones((2, 3), dtype=np.int64), 0)
    with pytest.raises(ValueError, match="mask_prob"):
        SequentialFamily(mask_prob=1.0)
    with pytest.raises(ValueError, match="SampledSoftmax needs item_counts"):
        SequentialFamily(SampledSoftmax())
    model = SASRec(SequenceConfig(num_items=5, max_len=4, dim=8))
    one = Sequences(np.arange(1), np.array([0, 1]), np.array([3]), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="no training sequence has 2 or more items"):
        window_batches(last_n(one, window_width(model)), 8)
    two = Sequences(np.arange(1), np.array([0, 2]), np.array([3, 4]), np.zeros(2, np.int64))
    quiet = TrainConfig(progress=False, tensorboard=False, plot=False)
    with pytest.raises(ValueError, match=r"batches must be windows \[B, 5\], got shape \(1, 4\)"):
        fit(model, window_batches(last_n(two, 4), 8), None, quiet, family=SequentialFamily())
    with pytest.raises(ValueError, match=r"item ids must be in 1..5 \(0 = padding\), got 1..9"):
        fit(model, window_batches(last_n(two, 5) * 2 + 1, 8), None, quiet, family=SequentialFamily())


# -- timestamps (HSTU's time buckets) ---------------------------------------------------------------------
HSTU_CFG = SequenceConfig(num_items=NUM_ITEMS, max_len=5, dim=8, num_layers=2, num_heads=2, dropout=0.0)


def _hstu(layout: Layout = Layout.JAGGED) -> HSTU:
    torch.manual_seed(0)
    model = HSTU(HSTU_CFG, optimizer=Adam(lr=0.05), layout=layout)
    with torch.no_grad():  # non-zero relative biases, so that the times change the outputs
        for layer in model.blocks:
            layer.pos_bias.normal_()
            layer.time_bias.normal_()
    return model


def _timed_chains(n: int, length: int, seed: int) -> tuple[Sequences, np.ndarray]:
    """_chains with increasing timestamps (seconds) spread over days, and the same windows of their times."""
    seqs = _chains(n, length, seed)
    gaps = np.random.default_rng(seed + 7).integers(1, 10**6, len(seqs.items))
    timed = Sequences(seqs.keys, seqs.offsets, seqs.items, np.cumsum(gaps))
    return timed, last_n(timed, length, values=timed.timestamps)


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_hstu_step_with_times_equals_a_padded_reference(data: st.DataObject) -> None:
    """The family's step on TimedWindows (jagged HSTU) = a hand-computed step: the padded model on the
    windows' inputs and their own times, logits over every item, cross entropy at the trained positions.
    B = 1 and short windows included; whatever times the padding columns hold, the loss is the same."""
    b = data.draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    windows = torch.randint(1, NUM_ITEMS + 1, (b, HSTU_CFG.max_len + 1), generator=g)
    for r in range(b):  # at least 2 items a row: an input and its target
        windows[r, : data.draw(st.integers(0, HSTU_CFG.max_len - 1))] = PAD
    times = torch.randint(0, 10**8, windows.shape, generator=g).sort(dim=1).values.masked_fill(windows == PAD, 0)
    garbage = times + (windows == PAD) * torch.randint(-(10**9), 10**9, windows.shape, generator=g)  # only at padding
    family = SequentialFamily(FullSoftmax(), times=True)
    model, ref = _hstu(), _hstu(Layout.PADDED)
    ctx = StepContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    got = family.step_loss(model, family.prepare(model, TimedWindows(windows, times), ctx), ctx)
    again = family.step_loss(model, family.prepare(model, TimedWindows(windows, garbage), ctx), ctx)
    later = times.clone()
    later[:, -1] += 10**9  # the last target's time: no input's, so no query reads it (no leak of the held-out time)
    last = family.step_loss(model, family.prepare(model, TimedWindows(windows, later), ctx), ctx)
    assert torch.equal(got, again) and torch.equal(got, last)
    seq, target = windows[:, :-1], windows[:, 1:]
    hidden, rows = ref(seq, torch.arange(1, NUM_ITEMS + 1), times[:, :-1])  # the inputs' times: never a target's
    valid = (seq != PAD) & (target != PAD)
    want = F.cross_entropy(hidden[valid] @ rows.T, target[valid] - 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.backward()
    want.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if p.grad is not None:  # the item table's rows are updated inside the backward (no .grad)
            assert q.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_times_change_the_hstu_step_and_the_no_times_path_is_unchanged() -> None:
    """With times the loss differs from the same windows without; without times the step is the model's own
    forward (the path of every run before times existed), bit for bit."""
    train, windows_times = _timed_chains(4, HSTU_CFG.max_len + 1, 0)
    windows = last_n(train, HSTU_CFG.max_len + 1)
    ctx = StepContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    timed, plain = SequentialFamily(times=True), SequentialFamily()
    model = _hstu()
    with torch.no_grad():
        with_t = timed.step_loss(model, timed.prepare(model, TimedWindows(torch.from_numpy(windows), torch.from_numpy(windows_times)), ctx), ctx)
        without = plain.step_loss(model, plain.prepare(model, torch.from_numpy(windows), ctx), ctx)
        seq, target = torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
        hidden, rows = model(seq, torch.arange(1, NUM_ITEMS + 1))
        valid = (seq != PAD) & (target != PAD)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, valid.reshape(-1).nonzero().squeeze(1))
        want = full_softmax(h.float(), rows.float(), target[valid] - 1)  # the step as it was before times
    assert not torch.allclose(with_t, without)
    assert torch.equal(without, want)


def test_hstu_with_times_resumes_to_the_bit_and_a_resume_cannot_switch_times(tmp_path: Path) -> None:
    """fit with TimedWindows and a timed validation: N steps + resume == the whole run, bitwise, early
    stopping's state included; resuming with times off (or on, for a run without) is refused naming the key."""
    train, times = _timed_chains(40, HSTU_CFG.max_len + 1, 0)
    windows = last_n(train, HSTU_CFG.max_len + 1)
    test, _ = _timed_chains(20, HSTU_CFG.max_len + 1, 1)
    hist = last_n(test, HSTU_CFG.max_len, ends=test.offsets[1:] - 1)
    valid = NextItemValidation(hist, test.items[test.offsets[1:] - 1], None, last_n(test, HSTU_CFG.max_len, ends=test.offsets[1:] - 1, values=test.timestamps))
    family = SequentialFamily(times=True, ks=(5,))
    kw: dict[str, Any] = {"epochs": 3, "lr": 0.01, "progress": False, "tensorboard": False, "plot": False, "early_stopping": EarlyStopping(patience=5)}
    whole = _hstu()
    fit(whole, window_batches(windows, 8, times=times), valid, TrainConfig(out_dir=str(tmp_path / "whole"), **kw), family=family)
    run = str(tmp_path / "part")
    first = fit(_hstu(), window_batches(windows, 8, times=times), valid, TrainConfig(max_steps=7, checkpoint_every=3, out_dir=run, **kw), family=family)
    assert first.steps == 7
    resumed = _hstu()
    history = fit(resumed, window_batches(windows, 8, times=times), valid, TrainConfig(out_dir=run, resume=True, **kw), family=family)
    assert history.steps == 15
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match=r"family\.times: True -> None"):
        fit(_hstu(), window_batches(windows, 8), None, TrainConfig(out_dir=run, resume=True, **kw), family=SequentialFamily(ks=(5,)))
    plain_run = str(tmp_path / "plain")
    fit(_hstu(), window_batches(windows, 8), None, TrainConfig(out_dir=plain_run, max_steps=2, **kw), family=SequentialFamily(ks=(5,)))
    with pytest.raises(ValueError, match=r"family\.times: None -> True"):
        fit(_hstu(), window_batches(windows, 8, times=times), valid, TrainConfig(out_dir=plain_run, resume=True, **kw), family=family)
    # validation reads the histories' times: scoring the same model without them gives other vectors
    q_times = query_vectors(resumed, torch.from_numpy(hist), times=valid.times)
    assert not torch.allclose(q_times, query_vectors(resumed, torch.from_numpy(hist)))
    assert next_item_metrics(resumed, hist, valid.targets, ks=(5,), times=valid.times)["recall@5"] == history.evals[-1]["recall@5"]


def test_recommend_next_with_times() -> None:
    """Each history's times, cut to max_len as its items are: the same scores as the timed query vectors."""
    model = _hstu()
    long, long_t = np.arange(1, 11), np.arange(10) * 86_400
    items, scores = recommend_next(model, [long, long[-5:]], k=5, times=[long_t, long_t[-5:]])
    assert (items[0] == items[1]).all()
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)
    _, plain = recommend_next(model, [long], k=5)
    assert not np.allclose(plain[0], scores[0])
    with pytest.raises(ValueError, match="history 0 has 10 items but 9 times"):
        recommend_next(model, [long], times=[long_t[1:]])
    with pytest.raises(ValueError, match="recommend_next: 2 times for 1 histories"):
        recommend_next(model, [long], times=[long_t, long_t])
    with pytest.raises(ValueError, match="query_vectors: SASRec cannot use timestamps"):
        recommend_next(SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=5, dim=8)), [long], times=[long_t])


def test_times_are_refused_where_they_cannot_be_used() -> None:
    train, times = _timed_chains(6, 6, 0)
    windows = last_n(train, 6)
    quiet = TrainConfig(progress=False, tensorboard=False, plot=False)
    with pytest.raises(ValueError, match=r"window_batches: times must have the shape of the items \(6, 6\), got \(6, 5\)"):
        window_batches(windows, 8, times=times[:, 1:])
    with pytest.raises(ValueError, match=r"window_batches: times must be integer seconds, got dtype torch\.float64"):
        window_batches(windows, 8, times=times.astype(np.float64))
    sasrec = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=5, dim=8))
    with pytest.raises(ValueError, match=r"SequentialFamily\(times=True\): SASRec cannot use timestamps"):
        fit(sasrec, window_batches(windows, 8, times=times), None, quiet, family=SequentialFamily(times=True))
    with pytest.raises(ValueError, match="the batches carry times but the family has times=False"):
        fit(_hstu(), window_batches(windows, 8, times=times), None, quiet, family=SequentialFamily())
    with pytest.raises(ValueError, match=r"SequentialFamily\(times=True\): the batches carry no times"):
        fit(_hstu(), window_batches(windows, 8), None, quiet, family=SequentialFamily(times=True))
    ctx = StepContext(torch.device("cpu"), torch.Generator())
    with pytest.raises(ValueError, match=r"SequentialFamily: times must have the shape of the items \(2, 6\), got \(2, 5\)"):
        SequentialFamily(times=True).prepare(_hstu(), TimedWindows(torch.from_numpy(windows[:2]), torch.from_numpy(times[:2, 1:])), ctx)
    with pytest.raises(ValueError, match=r"NextItemValidation: times must have the histories' shape \(6, 6\), got \(6, 5\)"):
        NextItemValidation(windows, windows[:, -1], None, times[:, 1:])
    with pytest.raises(ValueError, match="query_vectors: SASRec cannot use timestamps"):
        query_vectors(sasrec, torch.from_numpy(windows[:, 1:]), times=times[:, 1:])
    with pytest.raises(ValueError, match=r"SequentialFamily\(times=True\): the validation histories carry no times"):
        fit(_hstu(), window_batches(windows, 8, times=times), NextItemValidation(windows[:, 1:], windows[:, 0]), quiet, family=SequentialFamily(times=True))
    with pytest.raises(ValueError, match="times must be True or False"):
        SequentialFamily(times=1)  # type: ignore[arg-type]


# -- the ranking head's loss (ranking_weight) --------------------------------------------------------------
def test_ranking_weight_zero_is_the_next_item_step_and_a_weight_adds_the_ranking_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """ranking_weight 0 never calls the ranking pass, draws nothing more and keeps the settings as they were;
    w > 0 adds w x candidate_ranking_loss of each window's last max_len items against negatives drawn from
    the family generator (the same loss the model computes on its own) and the gradient reaches `rank`."""
    train, times = _timed_chains(6, HSTU_CFG.max_len + 1, 0)
    windows = torch.from_numpy(last_n(train, HSTU_CFG.max_len + 1))
    batch = TimedWindows(windows, torch.from_numpy(times))
    plain, ranked = SequentialFamily(times=True), SequentialFamily(times=True, ranking_weight=0.5, ranking_negatives=7)
    assert plain.settings() == SequentialFamily(times=True, ranking_weight=0.0).settings()
    assert "ranking_weight" not in plain.settings() and ranked.settings()["ranking_weight"] == 0.5 and ranked.settings()["ranking_negatives"] == 7
    model = _hstu()
    calls: list[int] = []
    real = HSTU.forward_ranked
    monkeypatch.setattr(HSTU, "forward_ranked", lambda self, *a: calls.append(1) or real(self, *a))
    g0, g1 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    ctx0, ctx1 = StepContext(torch.device("cpu"), g0), StepContext(torch.device("cpu"), g1)
    base = plain.step_loss(model, plain.prepare(model, batch, ctx0), ctx0)
    assert not calls and torch.equal(g0.get_state(), torch.Generator().manual_seed(0).get_state())
    prepared = ranked.prepare(model, batch, ctx1)
    step = prepared.inputs
    assert step.ranking is not None and step.ranking.negatives.shape == (6, 7)
    want_negatives = torch.randint(1, NUM_ITEMS + 1, (1, 6, 7), generator=torch.Generator().manual_seed(0))[0]
    assert torch.equal(step.ranking.negatives, want_negatives)
    total = ranked.step_loss(model, prepared, ctx1)
    assert calls == [1]
    rank_loss = model.candidate_ranking_loss(windows[:, -HSTU_CFG.max_len :], want_negatives, batch.times[:, -HSTU_CFG.max_len :])
    torch.testing.assert_close(total, base + 0.5 * rank_loss)
    total.backward()
    assert model.rank.weight.grad is not None and model.rank.weight.grad.abs().sum() > 0
    model.zero_grad()
    plain.step_loss(model, plain.prepare(model, batch, ctx0), ctx0).backward()
    assert model.rank.weight.grad is None or not model.rank.weight.grad.any()


def test_ranking_weight_zero_trains_bit_for_bit_as_before() -> None:
    """fit with ranking_weight = 0 (the default) gives the very weights of a family without the key's work;
    a weight changes them, the ranking head included."""
    train, times = _timed_chains(40, HSTU_CFG.max_len + 1, 0)
    windows = last_n(train, HSTU_CFG.max_len + 1)
    kw: dict[str, Any] = {"epochs": 2, "lr": 0.01, "progress": False, "tensorboard": False, "plot": False}
    runs = []
    for family in (SequentialFamily(times=True), SequentialFamily(times=True, ranking_weight=0.0), SequentialFamily(times=True, ranking_weight=1.0)):
        model = _hstu()
        fit(model, window_batches(windows, 8, times=times), None, TrainConfig(**kw), family=family)
        runs.append(model.state_dict())
    for k, a in runs[0].items():
        assert torch.equal(a, runs[1][k]), k
    assert not torch.equal(runs[0]["rank.weight"], runs[2]["rank.weight"])
    assert torch.equal(runs[0]["rank.weight"], _hstu().state_dict()["rank.weight"])  # untrained without the loss


def test_ranking_loss_resumes_to_the_bit_and_a_resume_cannot_change_the_weight(tmp_path: Path) -> None:
    train, times = _timed_chains(40, HSTU_CFG.max_len + 1, 0)
    windows = last_n(train, HSTU_CFG.max_len + 1)
    family = SequentialFamily(times=True, ranking_weight=0.5)
    kw: dict[str, Any] = {"epochs": 3, "lr": 0.01, "progress": False, "tensorboard": False, "plot": False}
    whole = _hstu()
    fit(whole, window_batches(windows, 8, times=times), None, TrainConfig(out_dir=str(tmp_path / "whole"), **kw), family=family)
    run = str(tmp_path / "part")
    assert fit(_hstu(), window_batches(windows, 8, times=times), None, TrainConfig(max_steps=7, checkpoint_every=3, out_dir=run, **kw), family=family).steps == 7
    resumed = _hstu()
    assert fit(resumed, window_batches(windows, 8, times=times), None, TrainConfig(out_dir=run, resume=True, **kw), family=family).steps == 15
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    for other, change in ((SequentialFamily(times=True, ranking_weight=0.25), r"family\.ranking_weight: 0\.5 -> 0\.25"),
                          (SequentialFamily(times=True), r"family\.ranking_weight: 0\.5 -> None"),
                          (SequentialFamily(times=True, ranking_weight=0.5, ranking_negatives=8), r"family\.ranking_negatives: 32 -> 8")):
        with pytest.raises(ValueError, match=change):
            fit(_hstu(), window_batches(windows, 8, times=times), None, TrainConfig(out_dir=run, resume=True, **kw), family=other)


def test_ranking_settings_are_checked() -> None:
    for weight in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match=r"SequentialFamily: ranking_weight must be a finite number >= 0"):
            SequentialFamily(ranking_weight=weight)  # type: ignore[arg-type]
    for negatives in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match=r"SequentialFamily: ranking_negatives must be an int >= 1"):
            SequentialFamily(ranking_weight=1.0, ranking_negatives=negatives)  # type: ignore[arg-type]
    sasrec = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=5, dim=8))
    family = SequentialFamily(ranking_weight=1.0)
    with pytest.raises(ValueError, match="ranking_weight > 0 trains a ranking head, which SASRec has not"):
        family.prepare(sasrec, torch.from_numpy(last_n(_chains(4, 6, 0), 6)), StepContext(torch.device("cpu"), torch.Generator()))


def test_a_trained_head_ranks_the_next_item_above_negatives_better_than_an_untrained_one() -> None:
    """The chain's next item is learnable: fit with the ranking loss, then the cached ranking head puts the
    true next item first among 9 random others far more often than the head of a run without the loss."""
    cfg = SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=16, num_layers=2, num_heads=2, dropout=0.0)
    windows = last_n(_chains(300, 7, 0), 7)
    test = torch.from_numpy(last_n(_chains(100, 6, 1), 6))
    negatives = torch.randint(1, NUM_ITEMS + 1, (100, 9), generator=torch.Generator().manual_seed(5))
    candidates = torch.cat([test[:, -1:], negatives], dim=1)
    firsts = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(0)
        model = HSTU(cfg, optimizer=Adam(lr=0.01))
        fit(model, window_batches(windows, 32), None, TrainConfig(epochs=8, lr=0.01, progress=False, tensorboard=False, plot=False),
            family=SequentialFamily(ranking_weight=weight, ranking_negatives=8))
        model.train(False)
        with torch.no_grad():
            scores = model.candidate_scores(test[:, :-1], candidates)
        hit = negatives == test[:, -1:]  # a negative equal to the target is no competitor
        firsts[weight] = float((scores[:, 0] > scores[:, 1:].masked_fill(hit, float("-inf")).max(dim=1).values).float().mean())
    assert firsts[1.0] > 0.8 and firsts[0.0] < 0.5, firsts
