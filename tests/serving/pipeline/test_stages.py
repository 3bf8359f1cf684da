"""The pipeline's stages as data: valid stages are built and normalised (lists to tuples), every invalid field
is refused on construction with a ValueError naming the field and its value, and a PipelineSpec holds the
stages in the one order Retrieve, [Filter], [Score], Order."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from hugerec.serving.pipeline.stages import (
    SOURCES,
    Ann,
    Boost,
    Condition,
    Filter,
    ItemToItem,
    Order,
    PipelineSpec,
    Popular,
    Retrieve,
    Score,
    Sequential,
    source_name,
)


def test_sources_have_their_names() -> None:
    sources = (Ann(3), ItemToItem(2, last=1), Popular(5, cold_k=9), Sequential(1))
    assert tuple(source_name(s) for s in sources) == SOURCES
    assert Retrieve(sources).sources == sources


def test_lists_become_tuples_and_defaults_hold() -> None:
    cond = Condition("item.region", "in", [1, 2.5])  # type: ignore[arg-type]  # a list, as TOML gives it
    assert cond.value == (1, 2.5) and cond.item_column == "region"
    f = Filter(allow=[4, 5], deny=[6])  # type: ignore[arg-type]
    assert f.allow == (4, 5) and f.deny == (6,) and f.exclude_seen
    score = Score(dense=["user.age"], sparse=[["user", "user.id"]])  # type: ignore[arg-type]
    assert score.dense == ("user.age",) and score.sparse == (("user", "user.id"),)
    order = Order(boosts=[Boost(Condition("promoted", "==", 1.0), multiply=2.0)])  # type: ignore[arg-type]
    assert isinstance(order.boosts, tuple) and order.max_k == 100


def test_spec_orders_stages_and_reads_context() -> None:
    retrieve, order, score = Retrieve((Popular(3),)), Order(), Score(sequential=True)
    spec = PipelineSpec((retrieve, score, order), context=(("hour", 12),))  # type: ignore[arg-type]
    assert spec.stage(Score) is score and spec.stage(Filter) is None
    assert spec.defaults == {"hour": 12.0} and isinstance(spec.context[0][1], float)


def test_score_sequential_modes() -> None:
    """true is the ranking head (what a saved pipeline's `sequential = true` meant before "next_item"); false
    and "" are off."""
    assert Score(sequential=True).sequential == "ranking_head" and Score(sequential="ranking_head").sequential == "ranking_head"
    assert Score(sequential="next_item").sequential == "next_item"
    assert Score(sparse=(("u", "user.id"),), sequential=False).sequential == ""


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: Ann(0), "Ann: k must be an integer >= 1, got 0"),
    (lambda: Ann(True), "Ann: k must be an integer >= 1, got True"),
    (lambda: ItemToItem(3, last=1.5), "ItemToItem: last must be an integer >= 1, got 1.5"),
    (lambda: Popular(3, cold_k=-1), "Popular: cold_k must be an integer >= 1, got -1"),
    (lambda: Sequential("5"), "Sequential: k must be an integer >= 1, got '5'"),
    (lambda: Retrieve(()), "Retrieve: sources must name at least one source"),
    (lambda: Retrieve((Ann(1), Ann(2))), "Retrieve: each source at most once, got ['ann', 'ann']"),
    (lambda: Condition("user.age", "==", 1.0), "Condition: column 'user.age' must be an item column"),
    (lambda: Condition("price", "~", 1.0), "Condition: op must be one of"),
    (lambda: Condition("price", "in", 3.0), "Condition price in: value must be a list of numbers, got 3.0"),
    (lambda: Condition("price", "in", (1.0, math.nan)), "value must be a list of numbers"),
    (lambda: Condition("price", "<", math.inf), "Condition price <: value must be a number or a reference, got inf"),
    (lambda: Condition("price", "<", True), "value must be a number or a reference, got True"),
    (lambda: Condition("price", "<", "shop.x"), "'shop.x' must be '<column>', 'item.<column>'"),
    (lambda: Condition("price", "<", "user."), "'user.' names nothing after the dot"),
    (lambda: Condition("", "<", 1.0), "a reference must be a non-empty string, got ''"),
    (lambda: Filter(deny=(1, True)), "Filter: deny must be a list of integer item ids, got (1, True)"),
    (lambda: Filter(allow=("7",)), "Filter: allow must be a list of integer item ids"),
    (lambda: Score(sequential=1), "Score.sequential must be one of ['next_item', 'ranking_head'], true or false, got 1"),
    (lambda: Score(sequential="next"), "Score.sequential must be one of ['next_item', 'ranking_head'], true or false, got 'next'"),
    (lambda: Score(dense=("user.age",), sequential=True), "sequential = 'ranking_head' takes no dense or sparse inputs"),
    (lambda: Score(dense=("user.age",), sequential="next_item"), "sequential = 'next_item' takes no dense or sparse inputs"),
    (lambda: Score(), "Score.sparse: needs distinct ranker feature names, got []"),
    (lambda: Score(sparse=(("u", "user.id"), ("u", "item.id"))), "needs distinct ranker feature names, got ['u', 'u']"),
    (
        lambda: Score(sparse=(("u", "user.id", "x"),)),
        "each entry must be [feature, reference], got ['u', 'user.id', 'x']",
    ),
    (lambda: Boost(Condition("a", "==", 1.0), multiply=-1.0), "Boost: multiply must be a finite number >= 0"),
    (lambda: Boost(Condition("a", "==", 1.0), add=math.nan), "add finite, got 1.0, nan"),
    (lambda: Order(diversity="category"), "Order: diversity and per_category go together, got 'category', None"),
    (lambda: Order(diversity="category", per_category=0), "Order: per_category must be an integer >= 1, got 0"),
    (lambda: Order(temperature=0.0), "Order: temperature must be a number > 0, got 0.0"),
    (lambda: Order(max_k=0), "Order: max_k must be an integer >= 1, got 0"),
    (lambda: PipelineSpec((Order(),)), "stages must be Retrieve, [Filter], [Score], Order (each once), got ['Order']"),
    (lambda: PipelineSpec((Order(), Retrieve((Ann(1),)))), "got ['Order', 'Retrieve']"),
    (
        lambda: PipelineSpec((Retrieve((Ann(1),)), Filter(), Filter(), Order())),
        "got ['Retrieve', 'Filter', 'Filter', 'Order']",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_fields_are_refused_naming_the_value(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        make()
    assert message in str(caught.value)
