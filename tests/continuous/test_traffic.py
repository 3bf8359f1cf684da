"""Simulated traffic without a server (an httpx mock transport answers): the columns clients send across a
schema change, /predict instances of a window's rows, a replay that counts answers per version, posts each
answered row's label with the token and counts every refusal; BackgroundLoad's bounds and which answers came
from a version that was not live."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pyarrow as pa
import pytest

from hugerec.continuous.traffic import Answer, BackgroundLoad, instances, replay, sent_schema
from hugerec.data.schema import Column, ColumnKind, Schema

SCHEMA = Schema((Column("label", ColumnKind.LABEL), Column("d0", ColumnKind.DENSE), Column("c0", ColumnKind.SPARSE)))


def _window(n: int = 5) -> pa.Table:
    return pa.table(
        {
            "ts": list(range(n)),
            "label": [float(i % 2) for i in range(n)],
            "d0": [0.5 * i for i in range(n)],
            "c0": list(range(10, 10 + n)),
            "c9": list(range(n)),
        }
    )


def _names(schema: Schema) -> list[str]:
    return list(schema.names)


def test_sent_schema_sends_only_what_a_live_version_takes() -> None:
    window = _window()
    assert _names(sent_schema(SCHEMA, window, [], "ts", "window 1")) == ["label", "d0", "c0", "c9"]
    assert _names(sent_schema(SCHEMA, window, [SCHEMA], "ts", "window 1")) == ["label", "d0", "c0"]
    newer = Schema((*SCHEMA.columns, Column("c9", ColumnKind.SPARSE)))
    assert _names(sent_schema(SCHEMA, window, [SCHEMA, newer], "ts", "window 1")) == ["label", "d0", "c0", "c9"]
    with pytest.raises(ValueError, match="window 1: the label column 'label' is missing"):
        sent_schema(SCHEMA, window.drop(["label"]), [SCHEMA], "ts", "window 1")


def test_instances_send_dense_by_name_and_ids_as_one_id_lists() -> None:
    assert instances(_window(2), SCHEMA) == [{"d0": 0.0, "c0": [10]}, {"d0": 0.5, "c0": [11]}]
    assert instances(_window(0), SCHEMA) == []


def _server(
    refuse_rows_from: int | None = None, feedback_status: int = 200
) -> tuple[httpx.Client, list[dict[str, object]]]:
    """A mock server: /predict answers version "2" with one request id per row; /feedback accepts known ids."""
    posted: list[dict[str, object]] = []
    issued: set[str] = set()

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/predict":
            rows = body["instances"]
            if refuse_rows_from is not None and rows[0]["c0"] == [10 + refuse_rows_from]:
                return httpx.Response(400, json={"error": "field 'instances[0].c0': bad"})
            ids = [f"id-{row['c0'][0]}" for row in rows]
            issued.update(ids)
            return httpx.Response(
                200, json={"model_version": "2", "request_ids": ids, "predictions": [0.5] * len(rows)}
            )
        posted.append({"labels": body["labels"], "authorization": request.headers.get("authorization")})
        if feedback_status != 200:
            return httpx.Response(feedback_status, json={"error": "feedback needs the ingest token"})
        known = sum(label["request_id"] in issued for label in body["labels"])
        return httpx.Response(200, json={"accepted": known, "unknown": len(body["labels"]) - known})

    return httpx.Client(transport=httpx.MockTransport(handle)), posted


def test_replay_counts_answers_and_posts_labels_with_the_token() -> None:
    client, posted = _server()
    out = replay("http://mock", "m", _window(5), SCHEMA, batch=2, client=client, token="t" * 24)
    assert out.answered == Counter({"2": 3}) and out.failed == 0 and out.errors == []
    assert (out.feedback_accepted, out.feedback_unknown) == (5, 0)
    assert posted[0] == {
        "labels": [{"request_id": "id-10", "label": 0.0}, {"request_id": "id-11", "label": 1.0}],
        "authorization": "Bearer " + "t" * 24,
    }


def test_replay_counts_refusals_with_their_messages() -> None:
    client, posted = _server(refuse_rows_from=2)
    out = replay("http://mock", "m", _window(5), SCHEMA, batch=2, client=client)
    assert out.answered == Counter({"2": 2}) and out.failed == 1
    assert out.errors == ['rows 2..: HTTP 400: {"error":"field \'instances[0].c0\': bad"}']
    assert all(p["authorization"] is None for p in posted)
    client, _ = _server(feedback_status=401)
    out = replay("http://mock", "m", _window(2), SCHEMA, batch=2, client=client)
    assert out.failed == 1 and out.errors[0].startswith("feedback of rows 0..: HTTP 401")
    client, posted = _server()
    assert replay("http://mock", "m", _window(2), SCHEMA, feedback=False, client=client).answered == Counter({"2": 1})
    assert posted == []


def test_background_load_bounds_and_answers_outside_live_intervals() -> None:
    rows = instances(_window(4), SCHEMA)
    with pytest.raises(ValueError, match="needs batch >= 1 and at least batch rows, got 5, 4 rows"):
        BackgroundLoad("http://mock", "m", rows, batch=5)
    with pytest.raises(ValueError, match="got 0, 4 rows"):
        BackgroundLoad("http://mock", "m", rows, batch=0)
    load = BackgroundLoad("http://mock", "m", rows, batch=2)
    load.answers = [Answer(1.0, 1.5, "1"), Answer(5.0, 5.2, "2"), Answer(9.0, 9.1, "2"), Answer(3.0, 3.1, "3")]
    live = {"1": [(0.0, 2.0)], "2": [(4.0, 6.0)]}
    assert load.outside(live) == [Answer(9.0, 9.1, "2"), Answer(3.0, 3.1, "3")]
    assert load.versions() == Counter({"2": 2, "1": 1, "3": 1})
