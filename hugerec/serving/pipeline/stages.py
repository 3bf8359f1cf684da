"""The four stages of a recommendation pipeline as data: Retrieve, Filter, Score, Order.

    PipelineSpec((
        Retrieve((Ann(k=300), ItemToItem(k=100, last=5), Popular(k=100))),
        Filter(exclude_seen=True, keep=(Condition("available", "==", 1.0), Condition("min_age", "<=", "user.age"))),
        Score(dense=("user.age", "item.price"), sparse=(("user", "user.id"), ("item", "item.id"))),
        Order(boosts=(Boost(Condition("promoted", "==", 1.0), multiply=1.5),), diversity="category", per_category=3),
    ))

Every stage is a frozen dataclass checked on construction (errors name the field and its value);
`PipelineRunner` (runner.py) runs them with a `match`. Names inside conditions and features refer to:
    "<column>"            a column of the item feature table (conditions only)
    "item.<column>"       the same, explicitly;  "item.id" the candidate's id
    "user.<column>"       a column of the user feature table;  "user.id" the user's id
    "context.<key>"       a number the request sends in `context` (only the keys the pipeline declares)
Data between stages is named by shape: K candidates of one user.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not in")
SOURCES = ("ann", "item_to_item", "popular", "sequential")


def _positive(where: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be an integer >= 1, got {value!r}")


def _reference(where: str, name: str) -> None:
    """A name of a value: "<column>", "item.<c>", "user.<c>" or "context.<key>"."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a reference must be a non-empty string, got {name!r}")
    scope, _, rest = name.partition(".")
    if rest and scope not in ("item", "user", "context"):
        raise ValueError(f"{where}: {name!r} must be '<column>', 'item.<column>', 'user.<column>' or 'context.<key>'")
    if rest == "" and "." in name:
        raise ValueError(f"{where}: {name!r} names nothing after the dot")


# -- Retrieve ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ann:
    """The two-tower's ANN index queried with the user vector computed online (user id + recent history)."""

    k: int  # candidates this source adds

    def __post_init__(self) -> None:
        _positive("Ann", "k", self.k)


@dataclass(frozen=True)
class ItemToItem:
    """The index queried with the mean item vector of the user's last `last` items it knows (unknown ids skipped)."""

    k: int  # candidates this source adds
    last: int = 5  # the user's last known items whose mean vector queries the index

    def __post_init__(self) -> None:
        _positive("ItemToItem", "k", self.k)
        _positive("ItemToItem", "last", self.last)


@dataclass(frozen=True)
class Popular:
    """The most popular items (by training interactions); `cold_k` of them when the user is cold (default k)."""

    k: int  # candidates this source adds
    cold_k: int | None = None  # candidates it adds for a user the models do not know (none: k)

    def __post_init__(self) -> None:
        _positive("Popular", "k", self.k)
        if self.cold_k is not None:
            _positive("Popular", "cold_k", self.cold_k)


@dataclass(frozen=True)
class Sequential:
    """A sequential model's next items for the user's recent history (a next-items bundle)."""

    k: int  # candidates this source adds

    def __post_init__(self) -> None:
        _positive("Sequential", "k", self.k)


Source = Ann | ItemToItem | Popular | Sequential


def source_name(source: Source) -> str:
    match source:
        case Ann():
            return "ann"
        case ItemToItem():
            return "item_to_item"
        case Popular():
            return "popular"
        case Sequential():
            return "sequential"


@dataclass(frozen=True)
class Retrieve:
    """Sources queried in order; candidates merged in that order, each id kept once (tagged with the
    first source that found it)."""

    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("Retrieve: sources must name at least one source")
        names = [source_name(s) for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"Retrieve: each source at most once, got {names}")


# -- Filter --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """`column op value`: column a name of an item value ("price", "item.price"); value a number, a list
    of numbers (for "in" / "not in") or a reference ("user.region", "context.age")."""

    column: str  # an item column: "price" or "item.price"
    op: str  # one of "==", "!=", "<", "<=", ">", ">=", "in", "not in"
    value: float | tuple[float, ...] | str  # a number, a list of numbers (in, not in) or a reference ("user.age", "context.hour")

    def __post_init__(self) -> None:
        _reference("Condition", self.column)
        if self.column.startswith(("user.", "context.")):
            raise ValueError(f"Condition: column {self.column!r} must be an item column")
        if self.op not in OPS:
            raise ValueError(f"Condition: op must be one of {list(OPS)}, got {self.op!r}")
        value = self.value
        if isinstance(value, list):
            value = tuple(value)
            object.__setattr__(self, "value", value)
        if self.op in ("in", "not in"):
            if not isinstance(value, tuple) or not all(_number(v) for v in value):
                raise ValueError(f"Condition {self.column} {self.op}: value must be a list of numbers, got {self.value!r}")
        elif isinstance(value, str):
            _reference("Condition", value)
        elif not _number(value):
            raise ValueError(f"Condition {self.column} {self.op}: value must be a number or a reference, got {self.value!r}")

    @property
    def item_column(self) -> str:
        return self.column.removeprefix("item.")


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Filter:
    """exclude_seen    drop items in the user's interaction store (and in the request's history)
    keep            conditions every kept item meets (availability, region, age...)
    allow           when given, only these item ids
    deny            never these item ids
    An item without a row in the item feature table fails every condition (counted as "no features")."""

    exclude_seen: bool = True
    keep: tuple[Condition, ...] = ()
    allow: tuple[int, ...] | None = None
    deny: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("allow", "deny"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
            v = getattr(self, name)
            if v is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
                raise ValueError(f"Filter: {name} must be a list of integer item ids, got {v!r}")


# -- Score ---------------------------------------------------------------------------------------------
NEXT_ITEM = "next_item"
RANKING_HEAD = "ranking_head"
SEQUENTIAL_SCORES = (NEXT_ITEM, RANKING_HEAD)


@dataclass(frozen=True)
class Score:
    """The ranking model on user x candidate rows, one batched call.

    dense       the ranker's dense inputs in order, each a reference ("user.age", "item.price", "context.hour")
    sparse      (ranker feature, reference) pairs: each ranker feature gets one id per row, e.g.
                ("user", "user.id"), ("item", "item.id"), ("category", "item.category")
    sequential  rank with the sequential model (a next-items bundle) instead of the ranker; no dense or
                sparse inputs. The user's history is encoded once and every candidate scored against it:
                "next_item"     the model's own next-item score (its query vector . the candidate's item
                                vector: what it was trained on), as a probability over the candidates;
                                any next-items model (SASRec, HSTU, ...)
                "ranking_head"  (or true) an HSTU's ranking head on each candidate attending to the history
                                (cached candidate scoring, M-FALCON); the head must have been trained
                                (model.ranking_weight > 0)
                false / ""      off (the ranker scores)
    """

    dense: tuple[str, ...] = ()
    sparse: tuple[tuple[str, str], ...] = ()
    sequential: bool | str = ""

    def __post_init__(self) -> None:
        match self.sequential:
            case bool():  # true: the ranking head, as before "next_item" existed (saved pipeline bundles say true)
                object.__setattr__(self, "sequential", RANKING_HEAD if self.sequential else "")
            case str() if self.sequential in SEQUENTIAL_SCORES or self.sequential == "":
                pass
            case _:
                raise ValueError(
                    f"Score.sequential must be one of {list(SEQUENTIAL_SCORES)}, true or false, got {self.sequential!r}"
                )
        if self.sequential:
            if self.dense or self.sparse:
                raise ValueError(
                    f"Score: sequential = {self.sequential!r} takes no dense or sparse inputs, got dense {list(self.dense)}, sparse {list(self.sparse)}"
                )
            return
        object.__setattr__(self, "dense", tuple(self.dense))
        object.__setattr__(self, "sparse", tuple(tuple(p) for p in self.sparse))
        for ref in self.dense:
            _reference("Score.dense", ref)
        for pair in self.sparse:
            if len(pair) != 2:
                raise ValueError(f"Score.sparse: each entry must be [feature, reference], got {list(pair)}")
            _reference("Score.sparse", pair[1])
        names = [f for f, _ in self.sparse]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Score.sparse: needs distinct ranker feature names, got {names}")


# -- Order ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Boost:
    """score * multiply + add for the items meeting `when` (applied in the order given)."""

    when: Condition  # the items boosted
    multiply: float = 1.0  # their score is multiplied by this (>= 0) ...
    add: float = 0.0  # ... then this is added

    def __post_init__(self) -> None:
        if not (_number(self.multiply) and _number(self.add)) or self.multiply < 0:
            raise ValueError(f"Boost: multiply must be a finite number >= 0 and add finite, got {self.multiply!r}, {self.add!r}")


@dataclass(frozen=True)
class Order:
    """Top-K by (boosted) score; at most `per_category` items of one value of item column `diversity`;
    temperature: sample without replacement from softmax(score / temperature) instead of taking the
    top (lower = greedier); max_k: the largest k a request may ask for."""

    boosts: tuple[Boost, ...] = ()  # score changes applied in order before ranking
    diversity: str | None = None  # an item column; with per_category, at most that many items share one value of it
    per_category: int | None = None  # the diversity cap (diversity and per_category go together)
    temperature: float | None = None
    max_k: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "boosts", tuple(self.boosts))
        if (self.diversity is None) != (self.per_category is None):
            raise ValueError(f"Order: diversity and per_category go together, got {self.diversity!r}, {self.per_category!r}")
        if self.per_category is not None:
            _positive("Order", "per_category", self.per_category)
        if self.diversity is not None:
            _reference("Order.diversity", self.diversity)
        if self.temperature is not None and not (_number(self.temperature) and self.temperature > 0):
            raise ValueError(f"Order: temperature must be a number > 0, got {self.temperature!r}")
        _positive("Order", "max_k", self.max_k)


Stage = Retrieve | Filter | Score | Order


@dataclass(frozen=True)
class PipelineSpec:
    """Retrieve first, Order last, Filter and Score (each optional, at most once) between; `context`:
    the keys a request may send (numbers), with their defaults; `max_history`: the user's most recent items
    handed to the models (the user tower, item-to-item, the sequential model), None: the longest history any
    of the pipeline's models reads (runner.py, `model_history`)."""

    stages: tuple[Stage, ...]
    context: tuple[tuple[str, float], ...] = field(default=())
    max_history: int | None = None

    def __post_init__(self) -> None:
        if self.max_history is not None:
            _positive("PipelineSpec", "max_history", self.max_history)
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "context", tuple((str(k), float(v)) for k, v in self.context))
        kinds = [type(s).__name__ for s in self.stages]
        if len(kinds) < 2 or kinds[0] != "Retrieve" or kinds[-1] != "Order" or len(set(kinds)) != len(kinds):
            raise ValueError(f"PipelineSpec: stages must be Retrieve, [Filter], [Score], Order (each once), got {kinds}")
        if not all(isinstance(s, Retrieve | Filter | Score | Order) for s in self.stages):
            raise ValueError(f"PipelineSpec: unknown stage in {kinds}")

    def stage(self, kind: type[Any]) -> Any:
        """The stage of type `kind`, or None."""
        return next((s for s in self.stages if isinstance(s, kind)), None)

    @property
    def defaults(self) -> Mapping[str, float]:
        return dict(self.context)
