"""ModelVersions: canary share, promote, rollback, unload rules."""

from __future__ import annotations

from typing import Any

import pytest

from hugerec.serving.http.versions import ModelVersions
from hugerec.serving.runtime.served_model import ServedModel


def fake(version: str) -> ServedModel:
    closed: list[str] = []
    served = ServedModel.__new__(ServedModel)
    served.name, served.version, served.closers = "m", version, [lambda: closed.append(version)]
    served.info = {"closed": closed}
    return served


def test_canary_share_promote_rollback() -> None:
    vs = ModelVersions("m", seed=0)
    for v in ("1", "2", "3"):
        vs.add(fake(v))
    assert vs.stable == "1" and vs.route().version == "1"
    vs.set_canary("2", 0.25)
    picks = [vs.route().version for _ in range(4000)]
    assert 0.2 < picks.count("2") / len(picks) < 0.3
    assert set(picks) == {"1", "2"}
    assert vs.promote() == "2"
    assert vs.status() == {
        "name": "m",
        "versions": ["1", "2", "3"],
        "stable": "2",
        "canary": None,
        "canary_share": 0.0,
        "history": ["1"],
    }
    vs.set_canary("3", 1.0)
    assert vs.route().version == "3"
    assert vs.live().version == "2"  # what unversioned metadata describes, whatever the canary's share
    assert vs.rollback() == "2"  # drops the canary
    assert vs.route().version == "2"
    assert vs.rollback() == "1"  # back to the previous stable
    with pytest.raises(ValueError, match="nothing to roll back"):
        vs.rollback()


def test_rules() -> None:
    vs = ModelVersions("m")
    with pytest.raises(KeyError, match="no version loaded"):
        vs.route()
    with pytest.raises(KeyError, match="no version loaded"):
        vs.live()
    vs.add(fake("1"))
    vs.add(fake("2"))
    with pytest.raises(ValueError, match="already loaded"):
        vs.add(fake("1"))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        vs.set_canary("2", 1.5)
    with pytest.raises(ValueError, match="stable one"):
        vs.set_canary("1", 0.5)
    with pytest.raises(KeyError, match="no version '9'"):
        vs.set_canary("9", 0.5)
    with pytest.raises(ValueError, match="no canary"):
        vs.promote()
    with pytest.raises(ValueError, match="serving traffic"):
        vs.remove("1")
    gone: Any = vs.remove("2")
    gone.close()
    gone.close()  # once only
    assert gone.info["closed"] == ["2"]
    assert vs.versions() == ["1"]
    assert vs.promote("1") == "1"
