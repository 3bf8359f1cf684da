"""The status page in a real browser: Debian's chromium, headless, driven by Selenium through Debian's
chromedriver (both from the system: nothing is downloaded). Opens the page, sees what is served, types the
admin token, sees the versions and the loop's decisions, and tries a recommendation of a pipeline and of a
next-items model, untimed and timed (an HSTU trained with times: the page shows a times field, checks it and
sends "history.times" / "items.times"). Skips, saying why, where chromium, chromedriver or selenium is missing (a fresh clone);
CI installs them (.ci/run) and sets HUGEREC_BROWSER_TEST=required, so that there it fails rather than skips."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from hugerec.continuous.decision_log import DecisionLog, Record
from hugerec.embedding.optimizers import Adam
from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.mf import MatrixFactorization
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SASRecConfig
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
from hugerec.serving.bundles.pipeline_bundle import export_pipeline
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.pipeline.declaration import declaration_from_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.training.model_file import RawIds, save_model

TOKEN = "browser-token-" + "b" * 16
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"  # a model name from a bundle manifest is hostile
# the flags that keep chromium from reaching for a network this machine does not have (each try costs seconds)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _browser() -> tuple[str, str] | str:
    """(chromium binary, chromedriver) from the system, or why the test cannot run here."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        return "no chromium / chromedriver on the PATH (Debian: apt-get install chromium chromium-driver; CI's .ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    real = Path("/usr/lib/chromium/chromium")  # Debian's binary behind the /usr/bin/chromium wrapper script
    return (str(real) if real.is_file() else chromium), driver


FOUND = _browser()
if isinstance(FOUND, str) and os.environ.get("HUGEREC_BROWSER_TEST") == "required":  # CI (.ci/run): run, never skip
    raise RuntimeError(f"HUGEREC_BROWSER_TEST=required, but {FOUND}")
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert not isinstance(FOUND, str)
    chromium, chromedriver = FOUND
    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        browser = webdriver.Chrome(options=options, service=Service(chromedriver))  # an explicit driver: no download
        browser.set_page_load_timeout(60)
        try:
            yield browser
        finally:
            browser.quit()


def pipeline_bundle(root: Path) -> Path:
    rng = np.random.default_rng(0)
    store = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    store.write("user", np.arange(50), {"age": rng.integers(10, 70, 50)})
    store.write("item", np.arange(40), {"price": rng.random(40)})
    torch.manual_seed(0)
    encoder = UserEncoder(MatrixFactorization(50, 40, 8))
    interactions = InteractionStore.from_pairs(rng.integers(0, 50, 300), rng.integers(0, 40, 300))
    declaration = declaration_from_dict(
        {
            "pipeline": {"name": "recs", "version": "1"},
            "retrieve": {"sources": [{"kind": "ann", "k": 20}, {"kind": "popular", "k": 10}]},
            "order": {"max_k": 50},
        },
        "browser test",
    )
    return export_pipeline(
        root / "recs", declaration, store, interactions, np.arange(40), encoder, IndexConfig(IndexKind.EXACT)
    )


def next_items_bundle(root: Path) -> Path:
    torch.manual_seed(0)
    config = SASRecConfig(max_len=4, dim=8, num_layers=1)
    model = SASRec(config.sequence_config(30), Adam(lr=0.01))
    raw = np.arange(1000, 1030, dtype=np.int64)
    counts = np.concatenate([[0], np.arange(30, 0, -1)]).astype(np.int64)
    save_model(root / "seq.pt", model, config, Adam(lr=0.01), ids=RawIds(raw, counts))
    return write_next_items_bundle(root / "seq.pt", root / "seq", name="seq", k=5)


def timed_bundles(root: Path) -> tuple[Path, Path]:
    """An HSTU trained with model.times = true as a next-items bundle ("tseq", raw ids 1000..1029) and as the
    sequential source of a pipeline ("trecs") over a store with each event's time."""
    torch.manual_seed(1)
    config = HSTUConfig(max_len=4, dim=8, num_layers=1, num_heads=2, times=True)
    raw = np.arange(1000, 1030, dtype=np.int64)
    counts = np.concatenate([[0], np.arange(30, 0, -1)]).astype(np.int64)
    save_model(root / "tseq.pt", HSTU(config.sequence_config(30)), config, Adam(lr=0.01), ids=RawIds(raw, counts))
    seq = write_next_items_bundle(root / "tseq.pt", root / "tseq", name="tseq", k=5)
    rng = np.random.default_rng(1)
    store = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    store.write("item", raw, {"price": rng.random(30)})
    users, items = rng.integers(0, 20, 200), rng.choice(raw, 200)
    interactions = InteractionStore.from_pairs(users, items, times=1_700_000_000 + 60 * np.arange(200))
    declaration = declaration_from_dict(
        {"pipeline": {"name": "trecs", "version": "1"}, "retrieve": {"sources": [{"kind": "sequential", "k": 10}]}, "order": {"max_k": 50}},
        "browser test",
    )
    return export_pipeline(root / "trecs", declaration, store, interactions, raw, sequential_bundle=seq), seq


@pytest.fixture(scope="module")
def url(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("browser")
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0), ServeOptions(state_dir=str(root / "v1")))
    srv.add_bundle(toy.bundle)
    srv.options = ServeOptions(state_dir=str(root / "v2"))
    srv.add_bundle(toy.bundle, version="2")
    srv.models["toy"].set_canary("2", 0.1)
    srv.options = ServeOptions(state_dir=str(root / "hostile"))
    srv.add_bundle(toy.bundle, name=HOSTILE)
    srv.add_bundle(pipeline_bundle(root))
    srv.add_bundle(next_items_bundle(root))
    for timed in timed_bundles(root):
        srv.add_bundle(timed)
    log = DecisionLog(root / "decisions.jsonl")
    log.append(Record(4, "publish", "gate passed; canary", {"auc": 0.74}, "2", {"stable": "1"}, 1700000020.0))
    log.append(
        Record(5, "retrain", "drift in price (PSI 0.410 >= 0.2)", {"price": 0.41}, "1", {"windows": 3}, 1700000040.0)
    )
    srv.status.show_decision_log(log.path)
    with BackgroundServer(srv) as address:
        yield address
    srv.close()


def wait_for(driver: Any, condition: Any, what: str, seconds: float = 30.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds, poll_frequency=0.1).until(condition, message=f"waited {seconds} s for {what}")


def rows(driver: Any, table: str) -> list[list[str]]:
    """The cells' text of a table, read in one script call (the page's refresh replaces rows every 5 s)."""
    script = "return [...document.querySelectorAll(arguments[0])].map((tr) => [...tr.cells].map((c) => c.textContent));"
    out: list[list[str]] = driver.execute_script(script, f"#{table} tbody tr")
    return out


def test_the_page_in_a_browser(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{url}/")
    wait_for(driver, lambda d: "ready" in d.find_element(By.ID, "state").text, "the script's first refresh")
    names = driver.execute_script("return [...document.querySelectorAll('#served .name')].map((e) => e.textContent);")
    assert names == [HOSTILE, "recs", "seq", "toy", "trecs", "tseq"]  # the hostile name shows as text
    assert driver.title == "hugerec server" and not driver.find_elements(By.CSS_SELECTOR, "#served img")
    assert driver.find_element(By.ID, "details").is_displayed() is False

    # a wrong token: refused, said so, the details stay hidden
    driver.find_element(By.ID, "token").send_keys("wrong-token-" + "w" * 16)
    driver.find_element(By.ID, "token-show").click()
    wait_for(driver, lambda d: "Bearer" in d.find_element(By.ID, "details-message").text, "the refusal")
    assert driver.find_element(By.ID, "details").is_displayed() is False

    # the token typed in goes out as a header: the details show, the URL and the page never hold it
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.ID, "token-show").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "details").is_displayed(), "the details")
    wait_for(driver, lambda d: len(rows(d, "versions")) == 7, "the versions table")
    versions = rows(driver, "versions")
    assert versions[3][:5] == ["toy", "model", "1", "stable", "-"]
    assert versions[4][:5] == ["toy", "model", "2", "canary", "0.1"]
    assert ["recs", "pipeline", "1", "stable", "-"] in [v[:5] for v in versions]
    decisions = rows(driver, "decisions")
    assert [d[1:4] for d in decisions] == [["5", "retrain", "1"], ["4", "publish", "2"]]
    assert decisions[0][4] == "drift in price (PSI 0.410 >= 0.2)" and decisions[1][5] == "auc 0.74"
    assert rows(driver, "drift") == [["price", "0.41"]]
    assert TOKEN not in driver.current_url and TOKEN not in driver.page_source
    assert driver.find_element(By.ID, "token").get_attribute("value") == ""

    # try a recommendation: the pipeline through /recommend, the next-items model through /v2 infer
    target = Select(driver.find_element(By.ID, "try-target"))
    assert [o.text for o in target.options] == ["recs (pipeline)", "seq (next_items)", "trecs (pipeline)", "tseq (next_items)"]
    target.select_by_value("recs")
    k = driver.find_element(By.ID, "try-k")
    k.clear()
    k.send_keys("05")  # leading zeros: no JSON number, so the script writes 5
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: len(rows(d, "try-items")) == 5, "five recommended items")
    assert "5 items from version 1" in driver.find_element(By.ID, "try-message").text
    items = rows(driver, "try-items")
    assert [r[0] for r in items] == ["1", "2", "3", "4", "5"] and all(0 <= int(r[1]) < 40 for r in items)
    assert {r[3] for r in items} <= {"ann", "popular"}
    assert not driver.find_element(By.ID, "try-times").is_displayed()  # an untimed pipeline: no times field

    target.select_by_value("seq")
    driver.find_element(By.ID, "try-history").send_keys("1000, 01003")
    driver.find_element(By.ID, "try-submit").click()
    wait_for(
        driver,
        lambda d: "from version" in d.find_element(By.ID, "try-message").text and rows(d, "try-items"),
        "next items",
    )
    assert all(1000 <= int(r[1]) < 1030 for r in rows(driver, "try-items"))

    # bad input: one line naming the field, nothing sent
    driver.find_element(By.ID, "try-history").send_keys(", x1")
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: "is not an integer id" in d.find_element(By.ID, "try-message").text, "the history error")
    assert not driver.find_element(By.ID, "try-times").is_displayed()  # an untimed next-items model: none either

    # a timed next-items model: its metadata lists "items.times", so the page asks for one time per history id
    target.select_by_value("tseq")
    wait_for(driver, lambda d: d.find_element(By.ID, "try-times").is_displayed(), "the times field")
    history, seconds = driver.find_element(By.ID, "try-history"), driver.find_element(By.ID, "try-times")
    history.clear()
    history.send_keys("1000, 1003, 1007")
    for typed, error in [
        ("", "times: give one time (seconds) per history id: 3 ids, 0 times"),
        ("100, 200", "times: give one time (seconds) per history id: 3 ids, 2 times"),
        ("100, 2x, 300", 'times: "2x" is not an integer (seconds)'),
        ("100, 50, 300", "times: 50 (time 2) is earlier than 100 before it: oldest first"),
    ]:
        seconds.clear()
        seconds.send_keys(typed)
        driver.find_element(By.ID, "try-submit").click()
        wait_for(driver, lambda d, e=error: d.find_element(By.ID, "try-message").text == e, f"the times error {error!r}")
        assert rows(driver, "try-items") == []
    seconds.clear()
    seconds.send_keys("-100, 0200, 99999999999")
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: "5 items from version" in d.find_element(By.ID, "try-message").text, "timed next items")
    body = {"inputs": [{"name": "items", "datatype": "INT64", "shape": [3], "data": [1000, 1003, 1007]},
                       {"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [3]},
                       {"name": "items.times", "datatype": "INT64", "shape": [3], "data": [-100, 200, 99999999999]}]}
    want = httpx.post(f"{url}/v2/models/tseq/infer", json=body).json()["outputs"][0]["data"]
    assert [int(r[1]) for r in rows(driver, "try-items")] == want

    # a timed pipeline: "history.times" beside the history (after the user's stored events)
    target.select_by_value("trecs")
    wait_for(driver, lambda d: d.find_element(By.ID, "try-times").is_displayed(), "the times field of the pipeline")
    user = driver.find_element(By.ID, "try-user")
    user.clear()
    user.send_keys("3")
    history.clear()
    history.send_keys("1001, 1002")
    seconds.clear()
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "try-message").text.startswith("times: give one time"), "the pipeline's times error")
    seconds.send_keys("2000000000, 2000000060")
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: "items from version 1" in d.find_element(By.ID, "try-message").text, "the timed pipeline's items")
    answer = httpx.post(f"{url}/recommend", json={"pipeline": "trecs", "user": 3, "k": 5, "history": [1001, 1002],
                                                  "history.times": [2000000000, 2000000060]}).json()
    assert [int(r[1]) for r in rows(driver, "try-items")] == answer["items"]

    # back to the untimed pipeline: the field hides, and a history goes without times as before
    target.select_by_value("recs")
    wait_for(driver, lambda d: not d.find_element(By.ID, "try-times").is_displayed(), "the times field hidden")
    user.clear()
    user.send_keys("1")
    history.clear()
    history.send_keys("1, 2")
    driver.find_element(By.ID, "try-submit").click()
    wait_for(driver, lambda d: "5 items from version 1" in d.find_element(By.ID, "try-message").text, "the untimed pipeline's items")

    # the page ran under its CSP without a violation (its inline script and style match their hashes)
    logs = driver.get_log("browser")
    assert not [e for e in logs if "Content Security Policy" in e.get("message", "")], json.dumps(logs)[:2000]
    assert driver.title == "hugerec server"  # the hostile name's onerror never ran

    driver.find_element(By.ID, "token-forget").click()
    assert driver.find_element(By.ID, "details").is_displayed() is False
