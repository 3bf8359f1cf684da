"""The status page's routes through real sockets: what the public sees, what the admin token opens, the
escaping of hostile names, no token and no request body ever in an answer; the decision log's bounded tail;
the latency quantiles against the exact ones."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from hugerec.continuous.decision_log import DecisionLog, Record
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.http.status_page import StatusConfig, histogram_quantile, read_decisions

TOKEN = "status-token-" + "s" * 16
HOSTILE = "<script>alert('name')</script>"  # a model name from a bundle manifest is hostile


def decision_log(path: Path) -> Path:
    """A small log the loop would write: a publish, a canary decision, a retrain for drift."""
    log = DecisionLog(path)
    log.append(Record(0, "trained", "window 0 trained", None, "w0", time=1700000000.0))
    log.append(Record(0, "publish", "gate passed; stable", {"auc": 0.71}, "w0", {"stable": "w0"}, 1700000010.0))
    log.append(Record(1, "publish", "gate passed; canary", {"auc": 0.74}, "w1", {"stable": "w0"}, 1700000020.0))
    log.append(
        Record(
            2,
            "wait",
            "not enough feedback",
            {"canary_count": 12.0, "stable_auc": float("nan")},
            "w1",
            {"stable": "w0"},
            1700000030.0,
        )
    )
    log.append(
        Record(
            2,
            "retrain",
            "drift in price (PSI 0.410 >= 0.2)",
            {"price": 0.41, "age": 0.02, "city": 0.3},
            "w0",
            {"windows": 3},
            1700000040.0,
        )
    )
    return path


@pytest.fixture(scope="module")
def served(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InferenceServer, str]]:
    root = tmp_path_factory.mktemp("status")
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0), ServeOptions(state_dir=str(root / "v1")))
    srv.add_bundle(toy.bundle)
    srv.options = ServeOptions(state_dir=str(root / "v2"))
    srv.add_bundle(toy.bundle, version="2")
    srv.models["toy"].set_canary("2", 0.25)
    srv.options = ServeOptions(state_dir=str(root / "hostile"))
    srv.add_bundle(toy.bundle, name=HOSTILE, version="<b>v</b>")
    srv.status.show_decision_log(decision_log(root / "decisions.jsonl"))
    with BackgroundServer(srv) as url:
        yield srv, url
    srv.close()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def no_token_in(r: httpx.Response) -> None:
    assert TOKEN not in r.text and TOKEN not in str(r.headers)
    assert base64.b64encode(TOKEN.encode()).decode() not in r.text


def test_the_page_lists_what_is_served_and_escapes_hostile_names(served: tuple[InferenceServer, str]) -> None:
    _, url = served
    r = httpx.get(f"{url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    no_token_in(r)
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in r.text and HOSTILE not in r.text
    assert "<span class=name>toy</span> <span class=kind>model</span>" in r.text
    # the one inline script and style run by hash; nothing else may (an injected script would not)
    csp = r.headers["content-security-policy"]
    scripts = re.findall(r"<script>(.*?)</script>", r.text, re.S)
    styles = re.findall(r"<style>(.*?)</style>", r.text, re.S)
    assert len(scripts) == 1 and len(styles) == 1
    for kind, text in (("script-src", scripts[0]), ("style-src", styles[0])):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert f"{kind} 'sha256-{digest}'" in csp
    assert "form-action 'none'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "http://" not in r.text.replace(url, "") and "https://" not in r.text  # nothing fetched from elsewhere
    assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"

    public = httpx.get(f"{url}/status").json()
    assert public["up"] is True and public["ready"] is True and public["details"] == "token" and public["more"] == 0
    assert public["served"] == [{"name": HOSTILE, "kind": "model"}, {"name": "toy", "kind": "model"}]
    assert "versions" not in json.dumps(public) and "decision" not in json.dumps(public)  # the details need the token


def test_details_need_the_admin_token_in_the_header(served: tuple[InferenceServer, str]) -> None:
    _, url = served
    for headers in ({}, auth("wrong-token-" + "w" * 16), {"Authorization": TOKEN}):
        r = httpx.get(f"{url}/status/details", headers=headers)
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        no_token_in(r)
    # a token put in the URL is refused, named as a mistake and not echoed (even with the right header)
    for query in (f"token={TOKEN}", f"access_token={TOKEN}", TOKEN):
        r = httpx.get(f"{url}/status/details?{query}", headers=auth())
        assert r.status_code == 400 and "Authorization: Bearer" in r.json()["error"]
        no_token_in(r)
        page = httpx.get(f"{url}/?{query}")
        assert page.status_code == 200
        no_token_in(page)
    r = httpx.get(f"{url}/status/details", headers=auth())
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    no_token_in(r)


def test_details_show_versions_canary_share_traffic_and_the_loop(toy: Any, served: tuple[InferenceServer, str]) -> None:
    _, url = served
    batch = toy.batch(3, seed=1)
    with httpx.Client() as client:
        for _ in range(20):
            assert (
                client.post(f"{url}/predict", json={"model": "toy", "instances": toy.instances(batch)}).status_code
                == 200
            )
        assert client.post(f"{url}/predict", json={"model": "toy", "instances": "nope"}).status_code == 400
    d = httpx.get(f"{url}/status/details", headers=auth()).json()
    toy_status = next(s for s in d["served"] if s["name"] == "toy")
    assert toy_status["stable"] == "1" and toy_status["canary"] == "2" and toy_status["canary_share"] == 0.25
    assert [(v["version"], v["role"], v["kind"]) for v in toy_status["versions"]] == [
        ("1", "stable", "model"),
        ("2", "canary", "model"),
    ]
    assert all(len(v["bundle_id"]) == 16 for v in toy_status["versions"])
    hostile = next(s for s in d["served"] if s["name"] == HOSTILE)
    assert hostile["stable"] == "<b>v</b>"  # JSON carries the raw text; the script writes it as text

    row = next(r for r in d["traffic"]["rows"] if (r["model"], r["endpoint"]) == ("toy", "predict"))
    assert row["requests"] == 21 and row["4xx"] == 1 and row["5xx"] == 0
    assert sum(row["versions"].values()) == 21 and set(row["versions"]) <= {"1", "2"}
    assert row["rate_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] < 5000
    assert d["traffic"]["window_s"] > 0

    loop = d["loop"]
    assert loop["log"].endswith("decisions.jsonl") and loop["problems"] == []
    assert [r["action"] for r in loop["records"]] == [
        "retrain",
        "wait",
        "publish",
        "publish",
        "trained",
    ]  # newest first
    wait = loop["records"][1]
    assert wait["version"] == "w1" and wait["window"] == 2 and wait["time"] == 1700000030.0
    assert wait["figures"] == [["canary_count", 12.0], ["stable_auc", None]]  # NaN is no JSON number
    assert loop["drift"]["window"] == 2 and "drift in price" in loop["drift"]["reason"]
    assert loop["drift"]["psi"] == [["price", 0.41], ["city", 0.3], ["age", 0.02]]


def test_no_route_echoes_a_request_body(served: tuple[InferenceServer, str]) -> None:
    _, url = served
    marker = "BODY-MARKER-" + "x" * 20
    body = json.dumps({"user": 1, "token": TOKEN, "note": marker})
    for path in ("/", "/status", "/status/details"):
        for method in ("POST", "PUT", "DELETE"):
            r = httpx.request(
                method, f"{url}{path}", content=body, headers={**auth(), "content-type": "application/json"}
            )
            assert r.status_code == 405, (method, path)
            assert marker not in r.text and TOKEN not in r.text
        r = httpx.request("GET", f"{url}{path}", content=body, headers=auth())  # a GET with a body: never read
        assert r.status_code == 200 and marker not in r.text
        no_token_in(r)
    # the page's form calls /recommend: its answers to bad input name the field, not the body
    r = httpx.post(f"{url}/recommend", json={"user": marker})
    assert r.status_code in (400, 404) and TOKEN not in r.text


def test_details_are_off_without_an_admin_token(toy: Any, tmp_path: Path) -> None:
    srv = InferenceServer(ServerConfig(), ServeOptions(state_dir=str(tmp_path / "state")))
    srv.add_bundle(toy.bundle)
    try:
        with BackgroundServer(srv) as url:
            assert httpx.get(f"{url}/status").json()["details"] == "off"
            r = httpx.get(f"{url}/status/details", headers=auth())
            assert r.status_code == 403 and "admin token" in r.json()["error"]
            assert httpx.get(f"{url}/").status_code == 200  # the page itself is there without a token
    finally:
        srv.close()


def test_the_try_forms_times_field_reads_the_public_metadata_of_every_version(tmp_path: Path) -> None:
    """The try form shows its times field when the chosen model reads times, which it learns from what the
    server publishes without a token: the metadata of the name and of each version lists "items.times" (a
    next-items model) or "history.times" (a pipeline) exactly when it reads them, so a canary trained with
    times shows the field too. The field is hidden in the page until then."""
    from hugerec.embedding.optimizers import Adam
    from hugerec.models.hstu import HSTU, HSTUConfig
    from hugerec.models.sasrec import SASRec
    from hugerec.models.sequence import SASRecConfig
    from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
    from hugerec.training.model_file import RawIds, save_model

    ids = RawIds(np.arange(20), np.r_[0, np.ones(20, np.int64)])
    bundles = {}
    for name, config in (("plain", SASRecConfig(max_len=4, dim=8, num_layers=1)), ("timed", HSTUConfig(max_len=4, dim=8, num_layers=1, times=True))):
        model = HSTU(config.sequence_config(20)) if isinstance(config, HSTUConfig) else SASRec(config.sequence_config(20))
        save_model(tmp_path / f"{name}.pt", model, config, Adam(lr=0.01), ids=ids)
        bundles[name] = write_next_items_bundle(tmp_path / f"{name}.pt", tmp_path / name, name="seq", k=3)
    srv = InferenceServer(ServerConfig(admin_token=TOKEN))
    srv.add_bundle(bundles["plain"])
    try:
        with BackgroundServer(srv) as url:
            page = httpx.get(f"{url}/").text
            assert re.search(r'<input id="try-times"[^>]* hidden>', page) and re.search(r'<label for="try-times"[^>]* hidden>', page)
            inputs = [i["name"] for i in httpx.get(f"{url}/v2/models/seq").json()["inputs"]]
            assert "items.times" not in inputs
            srv.add_bundle(bundles["timed"], version="2")
            srv.models["seq"].set_canary("2", 0.5)
            meta = httpx.get(f"{url}/v2/models/seq").json()
            assert meta["versions"] == ["1", "2"]
            by_version = {v: [i["name"] for i in httpx.get(f"{url}/v2/models/seq/versions/{v}").json()["inputs"]] for v in meta["versions"]}
            assert "items.times" not in by_version["1"] and "items.times" in by_version["2"]
    finally:
        srv.close()


def test_the_decision_log_is_read_as_a_bounded_tail(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    log = DecisionLog(path)
    for k in range(2000):
        log.append(Record(k, "wait", f"window {k} " + "r" * 100, {"canary_count": float(k)}, f"w{k}", time=1.0 + k))
    assert path.stat().st_size > 200_000
    out = read_decisions(str(path), 4096, 5)
    assert [r["window"] for r in out["records"]] == [1999, 1998, 1997, 1996, 1995] and out["problems"] == []
    assert out["drift"] is None
    # a torn last line (a write in progress) is skipped, not reported
    with open(path, "ab") as f:
        f.write(b'{"window": 2000, "action": "wa')
    assert read_decisions(str(path), 4096, 1)["records"][0]["window"] == 1999
    # a record longer than the tail: said, not shown in part
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"window": 1, "action": "wait", "reason": "x" * 5000, "time": 1.0}) + "\n")
    out = read_decisions(str(big), 1024, 5)
    assert out["records"] == [] and "no whole record in its last 1024 bytes" in out["problems"][0]
    out = read_decisions(str(big), 8192, 5)
    assert len(out["records"][0]["reason"]) == 300 and out["records"][0]["reason"].endswith("...")


def test_lines_that_are_not_records_are_reported_by_offset_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    good = json.dumps(
        {
            "window": 3,
            "action": "promote",
            "reason": "<img src=x onerror=alert(1)>",
            "time": 5.0,
            "gate": None,
            "version": "w3",
        }
    )
    lines = [
        good,
        "not json SECRET-LINE",
        "[1, 2]",
        '{"window": "3", "action": "wait", "time": 1.0}',
        '{"window": 3, "action": "wait", "time": "SECRET-LINE"}',
        '{"window": ' + "9" * 5000 + ', "action": "wait"}',  # beyond 64 bits (and Python's int digit limit)
        "[" * 100000 + "]" * 100000,
        '{"window": 4, "action": "wait", "time": 1e400, "gate": {"x": 1e400, "y": -1e400}}',
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode())
    out = json.loads(json.dumps(read_decisions(str(path), 1 << 20, 20), allow_nan=False))  # as the page gets it
    assert [r["window"] for r in out["records"]] == [4, 3]
    assert out["records"][1]["reason"] == "<img src=x onerror=alert(1)>"  # text: the page's script writes it as text
    assert out["records"][0]["time"] is None and out["records"][0]["figures"] == [["x", None], ["y", None]]
    # at most five per answer, the newest, in the file's order
    offsets = np.cumsum([0, *(len(line) + 1 for line in lines)])
    assert out["problems"] == [
        f"{path}, the line at byte {offsets[2]}: not a decision record: a list, not an object",
        f"{path}, the line at byte {offsets[3]}: not a decision record: no integer 'window' and string 'action'",
        f"{path}, the line at byte {offsets[4]}: not a decision record: 'time' is not a number",
        f"{path}, the line at byte {offsets[5]}: not a decision record: an integer beyond 64 bits",
        f"{path}, the line at byte {offsets[6]}: not a decision record: not JSON (JSONDecodeError)",
    ]
    path.write_bytes(("\n".join(lines[:2]) + "\n").encode())
    assert read_decisions(str(path), 4096, 5)["problems"] == [
        f"{path}, the line at byte {len(good) + 1}: not a decision record: not JSON (JSONDecodeError)"
    ]
    assert "SECRET-LINE" not in json.dumps(out)

    missing = read_decisions(str(tmp_path / "none.jsonl"), 4096, 5)
    assert missing["records"] == [] and "no such file yet" in missing["problems"][0]
    assert read_decisions(None, 4096, 5) == {"log": None, "records": [], "drift": None, "problems": []}


def test_the_status_config_names_a_bad_value() -> None:
    for kwargs, needle in (
        ({"tail_bytes": 10}, "tail_bytes must be in 1024"),
        ({"records": 0}, "records must be in 1..1000, got 0"),
        ({"rate_window_s": 0.5}, "rate_window_s must be in [2, 3600] seconds, got 0.5"),
        ({"max_names": 0}, "max_names must be in 1..10000, got 0"),
        ({"decision_log": ""}, "decision_log must be a path or None"),
    ):
        with pytest.raises(ValueError, match=re.escape(needle)):
            StatusConfig(**kwargs)


BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=1, max_size=300),
    st.sampled_from([0.01, 0.5, 0.9, 0.99, 1.0]),
)
def test_latency_quantiles_fall_in_the_bucket_of_the_exact_one(values: list[float], q: float) -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", buckets=BOUNDS, registry=registry)
    for v in values:
        histogram.observe(v)
    buckets = {float(s.labels["le"]): s.value for m in registry.collect() for s in m.samples if s.name == "h_bucket"}
    estimate = histogram_quantile(q, buckets)
    assert estimate is not None
    exact = float(np.quantile(np.array(values), q, method="inverted_cdf"))
    edges = (0.0, *BOUNDS)
    # the estimate lies in the bucket holding the exact quantile (the highest bound when beyond it)
    upper = next((b for b in BOUNDS if exact <= b), BOUNDS[-1])
    lower = max((e for e in edges if e < upper), default=0.0)
    assert lower - 1e-12 <= estimate <= upper + 1e-12, (exact, estimate)


def test_latency_quantile_without_observations_is_none() -> None:
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.5, {0.1: 0.0, 1.0: 4.0, float("inf"): 4.0}) == pytest.approx(0.55)
    assert histogram_quantile(0.99, {0.1: 0.0, 1.0: 0.0, float("inf"): 2.0}) == 1.0


def test_only_the_lines_shown_are_parsed_past_the_newest_records(tmp_path: Path) -> None:
    """Past the last `records` records, only a line mentioning a retrain is parsed (for the drift figures): a
    bad line older than both is never looked at, and the drift comes from the newest retrain."""
    path = tmp_path / "decisions.jsonl"
    records = [
        Record(0, "retrain", "drift in a", {"a": 0.5}, "w0", time=1.0).to_json(),
        "garbage that is never parsed",
        Record(1, "retrain", "drift in b", {"b": 0.3, "c": 0.7}, "w1", time=2.0).to_json(),
        *(Record(k, "wait", "not enough feedback", None, "w1", time=1.0 + k).to_json() for k in range(2, 40)),
    ]
    path.write_text("\n".join(records) + "\n")
    out = read_decisions(str(path), 1 << 20, 5)
    assert [r["window"] for r in out["records"]] == [39, 38, 37, 36, 35] and out["problems"] == []
    assert out["drift"] == {"window": 1, "time": 2.0, "reason": "drift in b", "psi": [("c", 0.7), ("b", 0.3)]}
