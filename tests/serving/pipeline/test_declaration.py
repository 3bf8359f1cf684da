"""A pipeline declared in TOML <-> PipelineSpec: every section read into its stage, the manifest's dict form
read back to the same declaration, and each mistake a ValueError naming the origin, the section, the key and
the value."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from hugerec.serving.pipeline.declaration import declaration_from_dict, declaration_to_dict
from hugerec.serving.pipeline.stages import Ann, Boost, Condition, Filter, ItemToItem, Order, Popular, Retrieve, Score

FULL = """
[pipeline]
name = "movies"
version = 3
context = { hour = 12 }

[retrieve]
sources = [{ kind = "ann", k = 300 }, { kind = "item_to_item", k = 100, last = 5 }, { kind = "popular", k = 10, cold_k = 50 }]

[filter]
exclude_seen = false
keep = [{ column = "available", op = "==", value = 1 }, { column = "min_age", op = "<=", value = "user.age" }]
allow = [1, 2, 3]
deny = [13]

[score]
dense = ["user.age", "item.price"]
sparse = [["user", "user.id"], ["item", "item.id"]]

[order]
boosts = [{ when = { column = "promoted", op = "in", value = [1, 2] }, multiply = 1.5, add = 0.1 }]
diversity = "category"
per_category = 3
temperature = 0.5
max_k = 40
"""


def test_every_section_becomes_its_stage() -> None:
    d = declaration_from_dict(tomllib.loads(FULL), "movies.toml")
    assert (d.name, d.version) == ("movies", "3")
    assert d.spec.stages == (
        Retrieve((Ann(300), ItemToItem(100, 5), Popular(10, cold_k=50))),
        Filter(False, (Condition("available", "==", 1), Condition("min_age", "<=", "user.age")), (1, 2, 3), (13,)),
        Score(("user.age", "item.price"), (("user", "user.id"), ("item", "item.id"))),
        Order((Boost(Condition("promoted", "in", (1, 2)), 1.5, 0.1),), "category", 3, 0.5, 40),
    )
    assert d.spec.defaults == {"hour": 12.0}


def test_the_dict_form_reads_back_to_the_same_declaration() -> None:
    seq = '[retrieve]\nsources = [{ kind = "sequential", k = 7 }]\n[score]\nsequential = '
    for text in (FULL, seq + "true\n", seq + '"next_item"\n', seq + '"ranking_head"\n'):
        d = declaration_from_dict(tomllib.loads(text), "p.toml")
        assert declaration_from_dict(declaration_to_dict(d), "manifest") == d
    assert declaration_from_dict(tomllib.loads(seq + "true\n"), "p.toml") == declaration_from_dict(tomllib.loads(seq + '"ranking_head"\n'), "p.toml")
    with pytest.raises(ValueError, match=r"Score\.sequential must be one of"):
        declaration_from_dict(tomllib.loads(seq + '"best"\n'), "p.toml")


def test_the_least_pipeline_takes_defaults() -> None:
    d = declaration_from_dict({"retrieve": {"sources": [{"kind": "popular", "k": 5}]}}, "p.toml")
    assert (d.name, d.version) == ("pipeline", "1")
    assert d.spec.stages == (Retrieve((Popular(5),)), Order())


def _retrieve() -> dict[str, Any]:
    return {"sources": [{"kind": "ann", "k": 5}]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "p.toml: a pipeline needs a [retrieve] section"),
        ({"retrieve": [], "order": {}}, "p.toml [retrieve]: must be a table, got []"),
        ({"retrieve": {"source": []}}, "p.toml [retrieve]: unknown key 'source'; known keys are ['sources']"),
        ({"retrieve": {"sources": {"kind": "ann"}}}, "p.toml [retrieve] sources: must be a list of tables"),
        ({"retrieve": {"sources": [{"kind": "knn", "k": 1}]}}, "p.toml [retrieve] sources[0]: kind must be one of"),
        (
            {"retrieve": {"sources": [{"kind": "ann", "k": 0}]}},
            "p.toml [retrieve] sources[0]: Ann: k must be an integer >= 1, got 0",
        ),
        ({"retrieve": {"sources": [{"kind": "ann", "k": 1, "depth": 2}]}}, "p.toml [retrieve] sources[0]:"),
        ({"pipeline": {"title": "x"}, "retrieve": _retrieve()}, "p.toml [pipeline]: unknown key 'title'"),
        (
            {"pipeline": {"context": {"hour": "noon"}}, "retrieve": _retrieve()},
            "p.toml [pipeline] context: must map keys to numbers",
        ),
        (
            {"pipeline": {"context": {"on": True}}, "retrieve": _retrieve()},
            "must map keys to numbers, got {'on': True}",
        ),
        (
            {"pipeline": {"name": "a/b"}, "retrieve": _retrieve()},
            "p.toml [pipeline] name: must be a non-empty string without '/', got 'a/b'",
        ),
        (
            {"retrieve": _retrieve(), "filter": {"keep": [{"column": "a", "op": "=="}]}},
            "p.toml [filter] keep[0]: missing key 'value'",
        ),
        (
            {"retrieve": _retrieve(), "filter": {"deny": ["x"]}},
            "p.toml [filter]: Filter: deny must be a list of integer item ids",
        ),
        (
            {"retrieve": _retrieve(), "score": {"dense": ["shop.x"], "sparse": [["u", "user.id"]]}},
            "p.toml [score]: Score.dense: 'shop.x'",
        ),
        (
            {"retrieve": _retrieve(), "order": {"boosts": [{"multiply": 2}]}},
            "p.toml [order] boosts[0]: missing key 'when'",
        ),
        (
            {"retrieve": _retrieve(), "order": {"max_k": 0}},
            "p.toml [order]: Order: max_k must be an integer >= 1, got 0",
        ),
        ({"retrieve": _retrieve(), "order": {"top": 3}}, "p.toml [order]: unknown key 'top'"),
    ],
)
def test_mistakes_name_the_origin_section_key_and_value(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        declaration_from_dict(data, "p.toml")
    assert message in str(caught.value)


def test_other_sections_are_left_to_their_readers() -> None:
    d = declaration_from_dict({"retrieve": _retrieve(), "inputs": {"anything": 1}}, "p.toml")
    assert d.spec.stage(Retrieve) == Retrieve((Ann(5),))
