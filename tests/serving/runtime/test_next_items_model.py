"""NextItemsModel: exact top-k next items equal a plain-NumPy ranking of the query vector against every item
vector (seen items excluded, raw ids in and out); unknown ids counted and skipped, histories longer than
max_len truncated and counted, a history with nothing known gets the most popular items; the v2 request and
response (JSON and binary outputs); bad k and bad outputs refused naming the value. A model trained with
times (HSTU, model.times = true) answers what recommend_next gives with the same times; bad "items.times"
are refused naming the field, and a model without times refuses the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.embedding.optimizers import Adam
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SASRecConfig
from hugerec.serving.bundles.next_items_bundle import load_next_items, write_next_items_bundle
from hugerec.serving.runtime.inference_protocol import HEADER_LENGTH, RequestError
from hugerec.serving.runtime.next_items_model import NextItemsModel, encode
from hugerec.training.model_file import RawIds, save_model
from hugerec.training.sequential import query_vectors, recommend_next

ITEMS = 12
RAW = np.arange(ITEMS, dtype=np.int64) * 10 + 100  # dense id d (1..I) is raw id RAW[d - 1]
COUNTS = np.array([0, 5, 1, 9, 2, 2, 7, 3, 0, 4, 6, 8, 1], np.int64)  # [I + 1], 0 at the padding id


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> NextItemsModel:
    folder = tmp_path_factory.mktemp("next_items")
    torch.manual_seed(0)
    config = SASRecConfig(max_len=4, dim=8, num_layers=1, num_heads=2)
    save_model(folder / "m.pt", SASRec(config.sequence_config(ITEMS)), config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    return load_next_items(write_next_items_bundle(folder / "m.pt", folder / "bundle", name="seq", version="2", k=3))


def _reference(model: NextItemsModel, dense_history: list[int], k: int) -> tuple[list[int], np.ndarray]:
    """Top-k raw ids by q . v over every item but those in the history, in plain NumPy."""
    padded = np.zeros((1, model.saved.max_len), np.int64)
    tail = dense_history[-model.saved.max_len :]
    padded[0, model.saved.max_len - len(tail) :] = tail
    q = query_vectors(model.saved.model, torch.from_numpy(padded)).numpy()[0]  # type: ignore[arg-type]
    scores = model.item_vectors.numpy() @ q  # [I]: dense id d at d - 1
    scores[np.array(dense_history) - 1] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    return RAW[order].tolist(), scores[order]


def test_top_k_equals_the_plain_ranking(model: NextItemsModel) -> None:
    histories = [[1, 5, 2], [7], [3, 3, 9, 10, 11, 12]]  # dense ids; the last one longer than max_len 4
    values = np.concatenate([RAW[np.array(h) - 1] for h in histories])
    out = model.next_items(values, np.array([len(h) for h in histories]), k=4)
    for b, h in enumerate(histories):
        items, scores = _reference(model, h, 4)
        assert out["items"][b].tolist() == items
        np.testing.assert_allclose(out["scores"][b], scores, rtol=1e-5, atol=1e-6)
    assert out["truncated_items"].tolist() == [0, 0, 2] and out["unknown_items"].tolist() == [0, 0, 0]


def test_unknown_ids_are_skipped_and_a_cold_history_gets_the_popular_items(model: NextItemsModel) -> None:
    values = np.array(
        [RAW[0], 7, 8, 9], np.int64
    )  # one known id then an unknown one; then a history of two unknown ids
    out = model.next_items(values, np.array([2, 2, 0]), k=3)
    assert out["unknown_items"].tolist() == [1, 2, 0]
    assert out["items"][0].tolist() == _reference(model, [1], 3)[0]
    popular = RAW[np.argsort(-COUNTS[1:], kind="stable")[:3]].tolist()  # 9, 8, 7 events
    assert out["items"][1].tolist() == popular and out["items"][2].tolist() == popular
    assert out["scores"][1].tolist() == [9.0, 8.0, 7.0]


def test_fewer_items_than_k_remain(model: NextItemsModel) -> None:
    out = model.next_items(RAW, np.array([ITEMS]), k=ITEMS)  # every item seen: nothing left to recommend
    assert out["items"].tolist() == [[-1] * ITEMS] and out["scores"].tolist() == [[0.0] * ITEMS]


@pytest.mark.parametrize("k", [0, ITEMS + 1])
def test_k_outside_the_catalogue_is_refused(model: NextItemsModel, k: int) -> None:
    with pytest.raises(RequestError, match=f"parameter 'k' = {k} must be in 1..{ITEMS}"):
        model.next_items(RAW[:1], np.array([1]), k=k)


def _request(**extra: object) -> bytes:
    body = {
        "inputs": [
            {"name": "items", "datatype": "INT64", "shape": [2], "data": [int(RAW[0]), int(RAW[1])]},
            {"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [2]},
        ],
        **extra,
    }
    return json.dumps(body).encode()


def test_a_v2_request_is_answered_as_json_or_binary(model: NextItemsModel) -> None:
    body, headers = model.answer(_request(id="r1"), None)
    assert headers == {"content-type": "application/json"}
    reply = json.loads(body)
    assert (reply["model_name"], reply["model_version"], reply["id"]) == ("seq", "2", "r1")
    outputs = {o["name"]: o for o in reply["outputs"]}
    assert outputs["items"]["shape"] == [1, 3] and outputs["items"]["data"] == _reference(model, [1, 2], 3)[0]
    body, headers = model.answer(_request(outputs=[{"name": "items", "parameters": {"binary_data": True}}]), None)
    header = int(headers[HEADER_LENGTH])
    described = json.loads(body[:header])["outputs"]
    assert [o["name"] for o in described] == ["items"] and described[0]["parameters"]["binary_data_size"] == 24
    assert np.frombuffer(body[header:], "<i8").tolist() == _reference(model, [1, 2], 3)[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"parameters": {"k": "3"}}, "parameter 'k' must be an integer, got '3'"),
        ({"parameters": {"k": True}}, "parameter 'k' must be an integer, got True"),
        ({"parameters": {"k": 10**30}}, "field 'parameters.k': an integer of 31 digits"),
        ({"outputs": {"name": "items"}}, "'outputs' must be a list"),
        ({"outputs": [{"name": "logits"}]}, "unknown output 'logits'; the model has"),
    ],
)
def test_bad_requests_are_refused_naming_the_value(
    model: NextItemsModel, extra: dict[str, object], message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        model.answer(_request(**extra), None)


def test_encode_writes_only_the_outputs_asked_for() -> None:
    outputs = {
        "items": np.array([[1, 2]]),
        "scores": np.array([[0.5, 0.25]]),
        "unknown_items": np.array([0]),
        "truncated_items": np.array([0]),
    }
    body, _ = encode("m", "1", {"outputs": [{"name": "scores"}]}, outputs)
    assert json.loads(body)["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.25]}]


def test_candidate_scoring_is_only_an_hstus(model: NextItemsModel) -> None:
    assert not model.scores_candidates
    with pytest.raises(ValueError, match="next-items model 'seq' is a sasrec, which has no candidate scoring"):
        model.candidate_scores(RAW[:2], RAW[2:5])


# -- a model trained on its items' timestamps (HSTU, model.times = true): "items.times" ------------------
TIMED_LEN = 4


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> NextItemsModel:
    folder = tmp_path_factory.mktemp("timed")
    torch.manual_seed(0)
    config = HSTUConfig(max_len=TIMED_LEN, dim=8, num_layers=2, num_heads=2, time_buckets=16, times=True)
    hstu = HSTU(config.sequence_config(ITEMS), Adam(lr=0.01), config.options())
    with torch.no_grad():  # time biases that matter (a fresh model's are zeros, which would make times a no-op)
        for layer in hstu.blocks:
            layer.time_bias.copy_(torch.randn(len(layer.time_bias)) * 3)
    save_model(folder / "m.pt", hstu, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    return load_next_items(write_next_items_bundle(folder / "m.pt", folder / "bundle", name="timed", k=3))


HISTORIES = [[1, 5, 2], [7], [3, 4, 9, 10, 11, 12]]  # dense ids; the last one longer than max_len 4
TIMES = [[100, 5_000, 90_000], [1_700_000_000], [10, 20, 3_600, 86_400, 864_000, 8_640_000]]


def _timed_request(values: list[int], times: object, lengths: list[int] | None = None, **extra: object) -> bytes:
    inputs: list[dict[str, object]] = [{"name": "items", "datatype": "INT64", "shape": [len(values)], "data": values}]
    if lengths is not None:
        inputs.append({"name": "items.lengths", "datatype": "INT64", "shape": [len(lengths)], "data": lengths})
    if times is not None:
        inputs.append({"name": "items.times", "datatype": "INT64", "shape": [len(values)], "data": times, **extra})
    return json.dumps({"inputs": inputs, "parameters": {"k": 4}}).encode()


def test_a_timed_model_answers_what_recommend_next_gives_with_times(timed: NextItemsModel) -> None:
    values = np.concatenate([RAW[np.array(h) - 1] for h in HISTORIES])
    out = timed.next_items(values, np.array([len(h) for h in HISTORIES]), k=4, times=np.concatenate(TIMES))
    hstu: HSTU = timed.saved.model  # type: ignore[assignment]
    items, scores = recommend_next(hstu, [np.array(h) for h in HISTORIES], k=4, exclude_history=True, times=[np.array(t) for t in TIMES])
    np.testing.assert_array_equal(out["items"], RAW[items - 1])
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-6, atol=1e-7)
    assert out["truncated_items"].tolist() == [0, 0, 2]
    # the same over HTTP's decoder (jagged, and [B, L] padded with -1 with times of the same shape)
    reply = json.loads(timed.answer(_timed_request(values.tolist(), [t for ts in TIMES for t in ts], [3, 1, 6]), None)[0])
    assert reply["outputs"][0]["data"] == RAW[items - 1].ravel().tolist()
    padded = np.full((3, 6), -1, np.int64)
    padded_t = np.full((3, 6), 123, np.int64)  # any value where an item slot is empty
    for b, (h, t) in enumerate(zip(HISTORIES, TIMES, strict=True)):
        padded[b, : len(h)], padded_t[b, : len(t)] = RAW[np.array(h) - 1], t
    body = {"inputs": [
        {"name": "items", "datatype": "INT64", "shape": [3, 6], "data": padded.tolist()},
        {"name": "items.times", "datatype": "INT64", "shape": [3, 6], "data": padded_t.tolist()},
    ], "parameters": {"k": 4}}
    reply = json.loads(timed.answer(json.dumps(body).encode(), None)[0])
    assert reply["outputs"][0]["data"] == RAW[items - 1].ravel().tolist()
    assert [i["name"] for i in timed.metadata()["inputs"]] == ["items", "items.lengths", "items.times"]


def test_times_change_the_answer_and_a_long_history_reads_its_tail_times(timed: NextItemsModel) -> None:
    h = RAW[np.array(HISTORIES[2]) - 1]
    t = np.array(TIMES[2])
    base = timed.next_items(h, np.array([6]), k=ITEMS - 6, times=t)
    head_changed = t.copy()
    head_changed[:2] = [-(2**40), 7]  # the two oldest items are cut (max_len 4): their times are never read
    same = timed.next_items(h, np.array([6]), k=ITEMS - 6, times=head_changed)
    np.testing.assert_array_equal(same["scores"], base["scores"])
    shifted = timed.next_items(h, np.array([6]), k=ITEMS - 6, times=t + 10**9)  # the buckets read differences only
    np.testing.assert_allclose(shifted["scores"], base["scores"], rtol=1e-6)
    tail_changed = t.copy()
    tail_changed[-1] = t[-2] + 1  # the most recent item's gap: another bucket
    assert not np.allclose(timed.next_items(h, np.array([6]), k=ITEMS - 6, times=tail_changed)["scores"], base["scores"])


@pytest.mark.parametrize(
    ("times", "extra", "message"),
    [
        (None, {}, "input 'items.times' is required: model 'timed' was trained on its items' timestamps"),
        ([1, 2], {}, r"input 'items.times': shape \[3\] needs 3 values, 'data' has 2"),
        ([1, 2, 3], {"shape": [1, 3]}, r"input 'items.times' has shape \[1, 3\]; it needs \[N\] beside"),
        ([1.5, 2, 3], {"datatype": "FP64"}, "input 'items.times' must hold integer seconds, got float64"),
        ([1.5, 2, 3], {}, "input 'items.times': datatype INT64 needs integers in 'data', got float64"),
        ([2**63, 2, 3], {}, "input 'items.times': "),  # beyond int64: NumPy reads the list as floats, refused as such
        ([-(2**63) - 1, 2, 3], {}, r"field 'inputs\[2\]\.data\[0\]': an integer of 19 digits"),
        ([[1], 2, 3], {}, "input 'items.times': 'data' is not a regular array"),
        ([[1, 2], [3, 4], [5, 6]], {}, r"input 'items.times': shape \[3\] needs 3 values, 'data' has 6"),
    ],
)
def test_bad_times_are_refused_naming_the_field(timed: NextItemsModel, times: object, extra: dict[str, object], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        timed.answer(_timed_request([int(v) for v in RAW[:3]], times, [3], **extra), None)


def test_binary_times_above_int64_are_refused(timed: NextItemsModel) -> None:
    header = json.dumps({"inputs": [
        {"name": "items", "datatype": "INT64", "shape": [3], "data": [int(v) for v in RAW[:3]]},
        {"name": "items.times", "datatype": "UINT64", "shape": [3], "parameters": {"binary_data_size": 24}},
    ]}).encode()
    blob = np.array([2**63, 2, 3], "<u8").tobytes()
    with pytest.raises(RequestError, match=r"input 'items\.times' has values above the int64 range"):
        timed.answer(header + blob, str(len(header)))
    ok = np.array([1, 2, 3], "<u8").tobytes()  # unsigned seconds in range are read as int64 (3 histories of one item)
    assert json.loads(timed.answer(header + ok, str(len(header)))[0])["outputs"][0]["shape"] == [3, 3]


def test_times_too_large_for_json_integers_are_refused(timed: NextItemsModel) -> None:
    body = _timed_request([int(v) for v in RAW[:3]], [1, 2, 3], [3]).replace(b"[1, 2, 3]", b"[1, 2, " + b"7" * 5000 + b"]")
    with pytest.raises(RequestError, match=r"field 'inputs\[2\]\.data\[2\]': an integer of 5000 digits"):
        timed.answer(body, None)


def test_a_model_without_times_refuses_them(model: NextItemsModel) -> None:
    with pytest.raises(RequestError, match=r"input 'items\.times': model 'seq' was trained without timestamps and does not take them"):
        model.answer(_timed_request([int(v) for v in RAW[:3]], [1, 2, 3], [3]), None)
    with pytest.raises(RequestError, match=r"input 'items\.times': model 'seq' was trained without timestamps"):
        model.next_items(RAW[:3], np.array([3]), times=np.array([1, 2, 3]))
    assert [i["name"] for i in model.metadata()["inputs"]] == ["items", "items.lengths"]
    assert "items.times" not in model.fields().inputs


def test_candidate_scores_of_a_timed_model_read_the_kept_histories_times(timed: NextItemsModel) -> None:
    """candidate_scores with times: unknown ids dropped with their times, the last max_len - 1 known ids kept
    with their own, the candidates at the latest event's time: HSTU.candidate_scores given exactly those; other
    times give other scores; times are required by this model and refused by one without them."""
    history = np.array([RAW[2], 99_999, RAW[0], RAW[4], RAW[6], RAW[1]])  # 99_999: unknown; 4 known after it
    times = np.array([5, 6, 700, 9_000, 86_400, 900_000])
    candidates = np.array([RAW[3], RAW[8], 77_777, RAW[10]])  # 77_777: unknown, -inf
    scores, truncated = timed.candidate_scores(history, candidates, times=times)
    assert truncated == 5 - (TIMED_LEN - 1)
    hstu: HSTU = timed.saved.model  # type: ignore[assignment]
    kept = [5, 7, 2]  # dense ids of RAW[4], RAW[6], RAW[1]: the last max_len - 1 = 3 known
    with torch.no_grad():
        want = hstu.candidate_scores(torch.tensor([kept]), torch.tensor([[4, 9, 11]]), torch.tensor([[9_000, 86_400, 900_000]]), torch.tensor([900_000]))
    np.testing.assert_allclose(scores[[0, 1, 3]], want[0].numpy(), rtol=1e-6)
    assert scores[2] == -np.inf
    other, _ = timed.candidate_scores(history, candidates, times=times * 0 + np.arange(6))
    assert not np.allclose(other[[0, 1, 3]], scores[[0, 1, 3]])
    with pytest.raises(ValueError, match="reads its items' times: give one per history item"):
        timed.candidate_scores(history, candidates)
    with pytest.raises(ValueError, match="2 times for 6 history items"):
        timed.candidate_scores(history, candidates, times=times[:2])


def test_a_served_hstus_item_table_is_in_memory_and_needs_no_staging(timed: NextItemsModel, tmp_path: Path) -> None:
    """Serving stages no lookup ahead (nothing prefetches in a next-items model or the pipeline's stages), and it
    need not: a served HSTU's item table is in memory, whatever table it trained on. The model file rebuilds the
    table from the model's config (no disk tier), and a dynamic item table is refused at save."""
    from hugerec.embedding.table_config import DynamicConfig
    from hugerec.models.sequence import ItemLookup

    model = timed.saved.model
    assert isinstance(model, HSTU)
    lookups = [m for m in model.modules() if isinstance(m, ItemLookup)]
    assert len(lookups) == 1 and not lookups[0].items.needs_staging and not lookups[0].items.has_disk_tables
    config = HSTUConfig(max_len=TIMED_LEN, dim=8, num_layers=1, num_heads=2, times=True)
    dynamic = HSTU(config.sequence_config(ITEMS, DynamicConfig()), Adam(lr=0.01), config.options())
    with pytest.raises(ValueError, match="save_model: a sequential model with a dynamic item table is not saved yet"):
        save_model(tmp_path / "dynamic.pt", dynamic, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
