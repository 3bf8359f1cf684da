"""The two-tower loop: warm starts beat the model they start from on the next day, the gate reads Recall@K, each
publish is a pipeline bundle with a fresh index that the server takes as the canary, a worse canary is rolled
back (the stable pipeline answers again), a better one promoted, a restarted loop redoes nothing."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
import torch

from hugerec.continuous.decision_log import Record
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.retrieval_loop import RetrievalLoop, RetrievalLoopConfig, _side_by_side
from hugerec.data.interactions import Interactions, held_out_csr
from hugerec.data.synthetic_interactions import (
    DriftConfig,
    InteractionConfig,
    InteractionDays,
    generate_interaction_days,
)
from hugerec.index.vector_index import load_index
from hugerec.serving.bundles.any_bundle import load
from hugerec.serving.pipeline.runner import Query
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.checkpoint import atomic_save
from hugerec.training.ranking_metrics import subset_csr
from hugerec.training.retrieval import retrieval_metrics

from .conftest import TOKEN

USERS, ITEMS = 600, 300


@cache
def _stream() -> InteractionDays:
    return generate_interaction_days(InteractionConfig(num_users=USERS, num_items=ITEMS, seed=5), DriftConfig(days=4, events=(5, 12)))


def _config(work: Path, **kw: object) -> RetrievalLoopConfig:
    return RetrievalLoopConfig(str(work), USERS, ITEMS, min_users=20, batch_size=256, **kw)  # type: ignore[arg-type]


def _actions(records: list[Record]) -> list[tuple[int, str, str | None]]:
    return [(r.window, r.action, r.version) for r in records]


def test_offline_loop_warm_starts_gates_on_recall_and_exports_a_fresh_index(tmp_path: Path) -> None:
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, keep_versions=2), stream.day)
    records = loop.run(0, 3)
    assert _actions(records) == [(k, a, v) for k in range(3) for a, v in (("trained", None), ("publish", f"w{k}"))]
    assert records[2].reason == "warm start from w0" and records[4].reason == "warm start from w1"
    published = [r for r in records if r.action == "publish"]
    assert all(r.gate is not None and r.gate["users"] == USERS for r in published)
    # the warm start learned the day the serving model missed: better on the next day than the model it started from
    for r in published[1:]:
        assert r.gate is not None and r.gate["candidate_recall"] > r.gate["serving_recall"]
    # each bundle holds its own model's index, and its pipeline excludes what the user met up to that window
    first, last = load_index(loop.bundle("w0") / "retrieval" / "index"), load_index(loop.bundle("w2") / "retrieval" / "index")
    q = np.ones((1, 32), np.float32)
    assert not np.array_equal(first.query(q, 10)[1].numpy(), last.query(q, 10)[1].numpy())
    pipe = load(loop.bundle("w2"))  # the published bundle, as a server loads it
    try:
        seen = set(loop.history(2).frame.filter(loop.history(2).frame["user"] == 7)["item"].to_list())
        rec = pipe.pipeline.recommend(Query(7, 50))
        assert len(rec.items) == 50 and not seen & set(rec.items.tolist()) and rec.sources[0] == "ann"
    finally:
        pipe.close()
    # the models the phases read stay in memory: the candidate as trained equals its checkpoint read back (by a loop
    # started again), and a warm start's model copied from the kept one equals it tensor for tensor, in storage of
    # its own (training it leaves the kept model as it was)
    fresh = RetrievalLoop(_config(tmp_path, keep_versions=2), stream.day)
    assert loop.recall(loop.load("w2"), 3) == loop.recall(fresh._read("w2"), 3)
    read, copied, kept = fresh._read("w2").state_dict(), loop._read("w2").state_dict(), loop.load("w2").state_dict()
    assert read.keys() == copied.keys() == kept.keys() and all(torch.equal(read[n], copied[n]) for n in read)
    assert all(copied[n].data_ptr() != kept[n].data_ptr() for n in kept if kept[n].numel())
    # each user's items so far, grown window by window, are the sets of the events so far
    for k in range(3):
        offsets, items = loop.seen(k)
        ref_offsets, ref_items = held_out_csr(loop.history(k))
        assert all(
            set(items[offsets[u] : offsets[u + 1]].tolist()) == set(ref_items[ref_offsets[u] : ref_offsets[u + 1]].tolist())
            for u in range(USERS)
        )
    # the gate's Recall@K (one exclusion per window, the recall alone) is the full metrics' recall@K, to the bit
    for version, k in (("w1", 2), ("w2", 3)):
        held = held_out_csr(stream.day(k))
        users = np.flatnonzero(np.diff(held[0]) > 0)
        empty = JaggedTensor(torch.zeros(0, dtype=torch.int64), torch.zeros(users.size, dtype=torch.int64))
        seen = subset_csr(held_out_csr(loop.history(k - 1)), users)
        full = retrieval_metrics(loop.load(version), torch.from_numpy(users), empty, subset_csr(held, users), seen, (50,))
        assert loop.recall(loop.load(version), k) == (full["recall@50"], users.size)
    assert loop.load("w2") is loop.load("w2")
    # a restarted loop redoes nothing; the gate refuses a candidate worse than the serving model
    again = RetrievalLoop(_config(tmp_path, keep_versions=2), stream.day)
    assert _actions(again.run(0, 3)) == _actions(records)
    strict = RetrievalLoop(_config(tmp_path / "strict"), stream.day)
    strict.step(0)
    atomic_save(strict.build().state_dict(), strict.checkpoint("w1"))  # an untrained candidate for window 1
    strict.log.append(Record(1, "trained", "untrained (test)", extra={"events": 0, "base": None}))
    strict.step(1)
    refused = strict.log.records[-1]
    assert refused.action == "refuse" and "below the serving w0's" in refused.reason


@pytest.mark.slow
def test_published_pipelines_are_canaries_rolled_back_or_promoted_by_recall(
    tmp_path: Path, server: tuple[str, Path]
) -> None:
    url, _ = server
    stream = _stream()
    publisher = Publisher(ServerTarget(url, "recs", TOKEN))

    def day(d: int) -> Interactions:  # the stream, then an empty day 4 (window 3's gate refuses: no users)
        return stream.day(d) if d < 4 else Interactions(stream.day(0).frame.clear(), USERS, ITEMS)

    loop = RetrievalLoop(_config(tmp_path / "loop", canary_share=0.5), day, publisher)
    loop.step(0)
    status = publisher.status()
    assert status is not None and status["stable"] == "w0"
    # an untrained pipeline goes out as the canary: window 1's events show it worse, it is rolled back
    atomic_save(loop.build().state_dict(), loop.checkpoint("bad"))
    publisher.publish(loop.export("bad", 0), "bad", 0.5)
    loop.step(1)
    decided = [r for r in loop.log.of_window(1) if r.action in ("promote", "rollback")]
    assert [(r.action, r.version) for r in decided] == [("rollback", "bad")]
    status = publisher.status()
    assert status is not None and (status["stable"], status["canary"]) == ("w0", "w1")
    answer = httpx.post(f"{url}/recommend", json={"user": 3, "k": 50}).json()
    assert len(answer["items"]) == 50
    # w1 (a warm start, better on window 2) is promoted; its pipeline and index serve from then on
    loop.step(2)
    assert [(r.action, r.version) for r in loop.log.of_window(2) if r.action in ("promote", "rollback")] == [("promote", "w1")]
    status = publisher.status()
    assert status is not None and (status["stable"], status["canary"]) == ("w1", "w2")
    # retention (keep_versions = 1): the previous stable w0 stays loaded with its bundle for a manual rollback
    assert {"w0", "w1", "w2"} <= set(status["versions"]) and loop.bundle("w0").is_dir()
    # window 3 decides on w2: whichever way, the server keeps stable, canary and one previous stable of ours
    loop.step(3)
    status = publisher.status()
    assert status is not None
    ours = {"w0", "w1", "w2", "w3"}
    previous = [v for v in dict.fromkeys(reversed(status["history"])) if v in ours and v not in (status["stable"], status["canary"])]
    assert set(status["versions"]) & ours == {status["stable"], status["canary"], *previous[:1]} - {None}
    dropped = {r.version for r in loop.log.records if r.action == "unload"}
    assert dropped == ours - set(status["versions"]) - {"w3"} - {r.version for r in loop.log.records if r.action == "refuse"}
    assert all(not loop.bundle(v).exists() and not loop.checkpoint(v).exists() for v in dropped)


def test_warm_starts_train_their_own_epochs_and_the_phases_reuse_what_they_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """warm_start_epochs: the first model trains `epochs`, each warm start `warm_start_epochs`; the gate's Recall@K of
    a (version, window) is computed once: the next window's decision reads the same figures."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, epochs=2, warm_start_epochs=1), stream.day)
    epochs: list[float | None] = []
    train, recall = loop.train, loop.recall
    calls: list[int] = []

    def counted(model, rows, counts, k, e=None):  # type: ignore[no-untyped-def]
        epochs.append(e)
        return train(model, rows, counts, k, e)

    def measured(model, k):  # type: ignore[no-untyped-def]
        calls.append(k)
        return recall(model, k)

    monkeypatch.setattr(loop, "train", counted)
    monkeypatch.setattr(loop, "recall", measured)
    loop.run(0, 3)
    assert epochs == [2, 1, 1]
    assert calls == [1, 2, 2, 3, 3]  # window k + 1: the candidate, then (from window 1 on) the serving model
    assert loop.recall_of("w1", 2) == (loop.log.records[3].gate["candidate_recall"], USERS)  # type: ignore[index]
    assert calls == [1, 2, 2, 3, 3]


def _batches(stream: InteractionDays, k: int, batch_size: int = 256) -> int:
    return -(-stream.day(k).num_events // batch_size)


@pytest.mark.parametrize("warm", [None, 0.5, 1.5, 1.25, 3.0])
def test_a_fractional_warm_start_trains_that_share_of_its_window_and_the_first_model_its_epochs(tmp_path: Path, warm: float | None) -> None:
    """warm_start_epochs = 1.5 (say): a warm start takes round(1.5 x its window's batches) steps, the first model
    (nothing to warm-start from) `epochs` x its batches, with or without the setting; each trained record says how
    many steps and epochs it took."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, epochs=2, warm_start_epochs=warm), stream.day)
    loop.run(0, 3)
    trained = [r for r in loop.log.records if r.action == "trained"]
    assert [r.reason for r in trained] == ["a fresh model on windows 0..0", "warm start from w0", "warm start from w1"]
    assert trained[0].extra == {"events": stream.day(0).num_events, "base": None, "epochs": 2, "steps": 2 * _batches(stream, 0)}
    for k in (1, 2):
        w = 2 if warm is None else warm
        assert trained[k].extra["epochs"] == w and trained[k].extra["steps"] == round(w * _batches(stream, k))  # type: ignore[index]


def test_a_fractional_epoch_count_trains_reproducibly_and_stops_mid_pass(tmp_path: Path) -> None:
    """1.5 epochs: 1.5 x the window's batches (not 2 passes' worth, another model than 2 epochs), the same model bit
    for bit on a second run."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, epochs=2, warm_start_epochs=1.5), stream.day)
    rows = stream.day(1)
    counts = np.bincount(rows.items(), minlength=ITEMS)
    n = _batches(stream, 1)
    half, full = loop.build(), loop.build()
    assert loop.train(half, rows, counts, 1, 1.5) == round(1.5 * n)
    assert loop.train(full, rows, counts, 1, 2) == 2 * n
    assert not all(torch.equal(a, b) for a, b in zip(half.state_dict().values(), full.state_dict().values(), strict=True))
    again = loop.build()
    assert loop.train(again, rows, counts, 1, 1.5) == round(1.5 * n)
    assert all(torch.equal(a, b) for a, b in zip(half.state_dict().values(), again.state_dict().values(), strict=True))


@pytest.mark.parametrize("reset", [False, True])
def test_a_warm_start_resets_the_sparse_optimizer_state_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset: bool) -> None:
    """warm_start_reset_optimizer: a warm start begins from the published weights with the Adagrad sums back at their
    initial value (0), else with the sums it was published with; the first model is fresh either way."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, warm_start_reset_optimizer=reset), stream.day)
    train = loop.train
    started: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def spied(model, rows, counts, k, e=None):  # type: ignore[no-untyped-def]
        state = {n: t.clone() for n, t in model.state_dict().items()}
        started.append(({n: t for n, t in state.items() if n.endswith(".sum")}, {n: t for n, t in state.items() if n.endswith(".weight")}))
        return train(model, rows, counts, k, e)

    monkeypatch.setattr(loop, "train", spied)
    loop.run(0, 2)
    (sums0, _), (sums1, weights1) = started
    assert sums0 and all(not t.any() for t in sums0.values())
    published = torch.load(loop.checkpoint("w0"), weights_only=True)
    assert all(torch.equal(weights1[n], published[n]) for n in weights1)  # the published weights, either way
    if reset:
        assert all(not t.any() for t in sums1.values())
    else:
        assert all(torch.equal(sums1[n], published[n]) and sums1[n].any() for n in sums1)
    reason = [r.reason for r in loop.log.records if r.action == "trained"][1]
    assert reason == "warm start from w0" + (" (sparse optimizer state reset)" if reset else "")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_a_bad_warm_start_epochs_is_refused(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="warm_start_epochs must be a number > 0 or None, got"):
        _config(tmp_path, warm_start_epochs=bad)


@pytest.mark.parametrize("keep", [0, 1])
def test_offline_retention_keeps_the_serving_version_and_keep_versions_previous_ones(tmp_path: Path, keep: int) -> None:
    """keep_versions offline: the last published version serves, the `keep` published before it stay (bundle and
    checkpoint) for a manual rollback; older ones lose their bundle and checkpoint, with an `unload` record each,
    once; a restart redoes nothing."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, keep_versions=keep), stream.day)
    records = loop.run(0, 3)
    dropped = [(r.window, r.version) for r in records if r.action == "unload"]
    assert dropped == ([(1, "w0"), (2, "w1")] if keep == 0 else [(2, "w0")])
    assert all("offline: its bundle deleted" in r.reason and r.extra["unloaded"] is False for r in records if r.action == "unload")
    kept = {"w2"} if keep == 0 else {"w1", "w2"}
    assert {p.name for p in (tmp_path / "bundles").iterdir()} == kept
    assert {p.stem for p in (tmp_path / "checkpoints").iterdir()} == kept
    again = RetrievalLoop(_config(tmp_path, keep_versions=keep), stream.day)
    assert _actions(again.run(0, 3)) == _actions(records)
    everything = RetrievalLoop(_config(tmp_path / "all", keep_versions=keep, keep_all_checkpoints=True), stream.day)
    everything.run(0, 2)
    assert {p.stem for p in (tmp_path / "all" / "checkpoints").iterdir()} == {"w0", "w1"}
    with pytest.raises(ValueError, match="keep_versions must be >= 0, got -1"):
        _config(tmp_path, keep_versions=-1)


def test_side_by_side_puts_each_rows_second_part_after_its_first() -> None:
    a = (np.array([0, 2, 2, 3]), np.array([5, 6, 7]))
    b = (np.array([0, 1, 3, 3]), np.array([8, 9, 10]))
    offsets, items = _side_by_side(a, b)
    assert offsets.tolist() == [0, 3, 5, 6] and items.tolist() == [5, 6, 8, 9, 10, 7]
    empty = (np.zeros(4, np.int64), np.zeros(0, np.int64))
    assert [x.tolist() for x in _side_by_side(empty, empty)] == [[0, 0, 0, 0], []]


def test_the_gate_reads_its_share_of_the_users_and_leaves_the_others_to_judge_the_served_model(tmp_path: Path) -> None:
    """gate_user_share < 1: the gate (and the canary decision) measure a fixed draw of the users, and a served model
    is judged on the others, whom no gate decision looked at; the two parts cover every user with events."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, gate_user_share=0.5), stream.day)
    records = loop.run(0, 2)
    drawn = loop.gate_users
    assert 0.4 < drawn.mean() < 0.6
    assert np.array_equal(drawn, RetrievalLoop(_config(tmp_path / "again", gate_user_share=0.5), stream.day).gate_users)
    held = held_out_csr(stream.day(1))
    active = np.diff(held[0]) > 0
    published = [r for r in records if r.action == "publish"]
    assert published[0].gate is not None and published[0].gate["users"] == (active & drawn).sum()
    model = loop.load("w0")
    gate_recall, gate_n = loop.recall(model, 1)
    rest_recall, rest_n = loop.recall(model, 1, gate=False)
    assert (gate_n, rest_n) == ((active & drawn).sum(), (active & ~drawn).sum())
    # each part is the exact recall over its users: the two parts, weighted by users, give the recall over all
    whole = RetrievalLoop(_config(tmp_path / "whole"), stream.day)
    all_recall, all_n = whole.recall(model, 1)
    assert all_n == gate_n + rest_n
    assert (gate_recall * gate_n + rest_recall * rest_n) / all_n == pytest.approx(all_recall, abs=1e-6)
    assert whole.recall(model, 1, gate=False)[1] == 0  # share 1: the gate reads every user


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_a_gate_user_share_outside_0_1_is_refused(tmp_path: Path, share: float) -> None:
    with pytest.raises(ValueError, match="gate_user_share must be in"):
        _config(tmp_path, gate_user_share=share)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_without_replay_a_warm_start_trains_on_its_window_alone_to_the_bit(tmp_path: Path) -> None:
    """warm_start_replay = 0 (the default): window 1's model is w0's warm-started on window 1's events alone, as
    before the key existed: the same training by hand gives the same weights bit for bit, and the record says 0
    replayed events."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, warm_start_epochs=1, keep_all_checkpoints=True), stream.day)
    loop.run(0, 2)
    by_hand = loop._read("w0")
    counts = np.bincount(loop.history(1).items(), minlength=ITEMS)
    loop.train(by_hand, stream.day(1), counts, 1, 1)
    assert _same(by_hand.state_dict(), _weights(loop.checkpoint("w1")))
    trained = [r for r in loop.log.records if r.action == "trained"]
    assert trained[1].reason == "warm start from w0" and trained[1].extra is not None
    assert (trained[1].extra["events"], trained[1].extra["replayed"]) == (stream.day(1).num_events, 0)
    assert "replayed" not in (trained[0].extra or {})  # the first model, from scratch, replays nothing


@pytest.mark.parametrize("replay", [0.5, 1.0, 100.0])
def test_a_warm_start_replays_a_uniform_draw_of_earlier_events_and_counts_its_epochs_over_both(tmp_path: Path, replay: float) -> None:
    """warm_start_replay r: a warm start at window k trains on window k's events and round(r x their count) events
    of windows 0..k-1 (every one of them when fewer exist), drawn without replacement; its epochs count over the
    combined events; each trained record says how many were replayed."""
    stream = _stream()
    loop = RetrievalLoop(_config(tmp_path, warm_start_epochs=1.5, warm_start_replay=replay), stream.day)
    trained_on: list[Interactions] = []
    train = loop.train

    def spied(model, rows, counts, k, e=None):  # type: ignore[no-untyped-def]
        trained_on.append(rows)
        return train(model, rows, counts, k, e)

    loop.train = spied  # type: ignore[method-assign]
    loop.run(0, 3)
    trained = [r for r in loop.log.records if r.action == "trained"]
    assert trained[0].extra is not None and trained[0].extra["events"] == stream.day(0).num_events  # the first model: none
    for k in (1, 2):
        window, earlier = stream.day(k), loop.history(k - 1)
        n = min(round(replay * window.num_events), earlier.num_events)
        extra = trained[k].extra
        assert extra is not None and (extra["replayed"], extra["events"]) == (n, window.num_events + n)
        assert trained[k].reason.endswith(f"with {n} replayed events of windows 0..{k - 1}")
        assert extra["steps"] == round(1.5 * -(-(window.num_events + n) // 256))
        rows = trained_on[k].frame.select("user", "item", "timestamp")
        # the rows trained on: the window's events and, beside them, events of the earlier windows, none twice
        key = ["user", "item", "timestamp"]
        got = rows.group_by(key).len()
        have = pl.concat([window.frame.select(key), earlier.frame.select(key)]).group_by(key).len()
        joined = got.join(have, on=key, how="left", suffix="_have")
        assert joined["len_have"].null_count() == 0 and (joined["len"] <= joined["len_have"]).all()
        if n == earlier.num_events:
            assert got.sort(key).equals(have.sort(key))
    # the draw is seeded by (seed, window): another seed draws other events, the same seed the same
    assert loop.replay(2, stream.day(2)).frame.equals(loop.replay(2, stream.day(2)).frame)
    other = RetrievalLoop(_config(tmp_path / "other", warm_start_replay=replay, seed=1), stream.day)
    if replay < 100:
        assert not other.replay(2, stream.day(2)).frame.equals(loop.replay(2, stream.day(2)).frame)


def test_a_restarted_loop_with_replay_trains_the_same_models_to_the_bit(tmp_path: Path) -> None:
    """The draw depends on the seed, the window and the events alone (not on what the process computed before): a
    loop stopped after window 1 and started again in a new process (nothing kept in memory) trains the same w2 as
    a loop that ran straight through, bit for bit."""
    stream = _stream()
    kw: dict[str, object] = {"warm_start_epochs": 1, "warm_start_replay": 0.5, "warm_start_reset_optimizer": True, "keep_all_checkpoints": True}
    straight = RetrievalLoop(_config(tmp_path / "straight", **kw), stream.day)
    straight.run(0, 3)
    stopped = RetrievalLoop(_config(tmp_path / "stopped", **kw), stream.day)
    stopped.run(0, 2)
    again = RetrievalLoop(_config(tmp_path / "stopped", **kw), stream.day)
    assert _actions(again.run(0, 3)) == _actions(straight.log.records)
    for v in ("w0", "w1", "w2"):
        assert _same(_weights(straight.checkpoint(v)), _weights(again.checkpoint(v)))
    replayed = [r.extra["replayed"] for r in again.log.records if r.action == "trained" and r.extra and "replayed" in r.extra]
    assert len(replayed) == 2 and all(n > 0 for n in replayed)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), True, "1"])
def test_a_bad_warm_start_replay_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="warm_start_replay must be a number >= 0, got"):
        _config(tmp_path, warm_start_replay=bad)
