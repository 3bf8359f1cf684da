"""The served-object protocol: every kind implements it, a route a kind lacks is a 400 naming the object and its
kind, and the HTTP wing never asks which kind it holds (no isinstance on served kinds, no is_*_bundle)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from hugerec.serving.http.versions import ModelVersions
from hugerec.serving.pipeline.served_pipeline import ServedPipeline
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.inference_protocol import LiveFields
from hugerec.serving.runtime.next_items_model import NextItemsModel
from hugerec.serving.runtime.served_model import ServedModel
from hugerec.serving.runtime.served_object import ServedObject, Unsupported

HTTP = Path(__file__).resolve().parents[3] / "hugerec" / "serving" / "http"
KINDS = {"ServedObject", "ServedModel", "ServedPipeline", "NextItemsModel", "GBMModel", "InferenceModel"}


class Echo(ServedObject):
    """The smallest served object: what a new kind must implement."""

    family = "echo"
    platform = "echo"

    def __init__(self) -> None:
        self.name, self.version, self.info = "e", "1", {}

    @property
    def kind(self) -> str:
        return "echo"

    def metadata(self) -> dict[str, Any]:
        return {"platform": self.platform, "inputs": [{"name": "x"}], "outputs": [{"name": "y"}]}

    def max_rows(self) -> int:
        return 3

    def fields(self) -> LiveFields:
        return LiveFields(frozenset({"x"}))

    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        return body, {}

    def close(self) -> None:
        pass


def test_every_kind_implements_the_protocol() -> None:
    for kind in (ServedModel, ServedPipeline, NextItemsModel):
        assert issubclass(kind, ServedObject) and not getattr(kind, "__abstractmethods__", None), kind


def test_routes_a_kind_lacks_are_400s_naming_it_and_the_config_comes_from_the_metadata() -> None:
    e = Echo()
    assert e.config(BatchingConfig()) == {"name": "e", "platform": "echo", "max_batch_size": 3, "input": [{"name": "x"}], "output": [{"name": "y"}]}
    for call, what in (
        (lambda: asyncio.run(e.predict([], LiveFields())), "/predict"),
        (lambda: e.recommend({}), "/recommend"),
        (lambda: e.add_interactions({}), "/recommend/interactions"),
        (lambda: e.update_features({}), "/recommend/features"),
        (e.delta_base, "version deltas"),
    ):
        with pytest.raises(Unsupported, match=f"echo 'e' \\(version '1'\\) does not support {what}") as caught:
            call()
        assert caught.value.status == 400
    assert e.parameter_server() is None


def test_one_name_serves_one_family() -> None:
    versions = ModelVersions("e")
    versions.add(Echo())
    other = ServedModel.__new__(ServedModel)
    other.name, other.version, other.info, other.closers = "e", "2", {}, []
    with pytest.raises(ValueError, match="'e' serves echo versions; version '2' is a model"):
        versions.add(other)


def test_the_http_wing_never_asks_which_kind_it_serves() -> None:
    found = []
    for path in sorted(HTTP.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            named = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if (name == "isinstance" and named & KINDS) or (name.startswith("is_") and name.endswith("_bundle")):
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []
