"""A pipeline declared as data: TOML (or the same structure as JSON in a bundle's manifest) <-> PipelineSpec.

    [pipeline]
    name = "movies"
    version = "1"
    context = { hour = 12.0 }                  # keys a request may send, with their defaults
    max_history = 200                          # optional: the recent items the models are handed (left out:
                                               # the longest history any of the pipeline's models reads)

    [retrieve]
    sources = [{ kind = "ann", k = 300 }, { kind = "item_to_item", k = 100, last = 5 }, { kind = "popular", k = 100 }]

    [filter]                                   # optional
    exclude_seen = true
    keep = [{ column = "available", op = "==", value = 1 }, { column = "min_age", op = "<=", value = "user.age" }]
    deny = [13, 7]                             # allow = [...] keeps only those

    [score]                                    # optional: needs a ranker bundle
    dense = ["user.age", "item.price"]
    sparse = [["user", "user.id"], ["item", "item.id"]]
                                               # or: sequential = "next_item" (the next-items model ranks)

    [order]
    boosts = [{ when = { column = "promoted", op = "==", value = 1 }, multiply = 1.5 }]
    diversity = "category"
    per_category = 3
    temperature = 0.5                          # optional exploration
    max_k = 100

Sections other than these (e.g. the CLI's [inputs]) are left to their readers. Every mistake is a
ValueError naming the file (or "manifest"), the key and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hugerec.serving.pipeline.stages import (
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
    Source,
    Stage,
)

SECTIONS = ("pipeline", "retrieve", "filter", "score", "order")
_SOURCES: dict[str, Callable[..., Source]] = {"ann": Ann, "item_to_item": ItemToItem, "popular": Popular, "sequential": Sequential}


@dataclass(frozen=True)
class PipelineDeclaration:
    name: str
    version: str
    spec: PipelineSpec


def _keys(where: str, table: object, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table, got {table!r}")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; known keys are {list(allowed)}")
    missing = [k for k in required if k not in table]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    return table


def _build(where: str, make: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return make(**kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def _condition(where: str, d: object) -> Condition:
    t = _keys(where, d, ("column", "op", "value"), ("column", "op", "value"))
    cond: Condition = _build(where, Condition, **t)
    return cond


def declaration_from_dict(data: Mapping[str, Any], where: str) -> PipelineDeclaration:
    """A parsed TOML document (or manifest "pipeline" object) -> the declaration; `where` names its origin."""
    head = _keys(f"{where} [pipeline]", data.get("pipeline", {}), ("name", "version", "context", "max_history"))
    context = head.get("context", {})
    if not isinstance(context, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in context.values()):
        raise ValueError(f"{where} [pipeline] context: must map keys to numbers, got {context!r}")
    max_history = head.get("max_history")
    if max_history is not None and (isinstance(max_history, bool) or not isinstance(max_history, int) or max_history < 1):
        raise ValueError(
            f"{where} [pipeline] max_history: must be an integer >= 1 (the recent items the models are handed; leave it "
            f"out to follow the models), got {max_history!r}"[:300]
        )
    stages: list[Stage] = []
    if "retrieve" not in data:
        raise ValueError(f"{where}: a pipeline needs a [retrieve] section")
    r = _keys(f"{where} [retrieve]", data["retrieve"], ("sources",), ("sources",))
    if not isinstance(r["sources"], list):
        raise ValueError(f"{where} [retrieve] sources: must be a list of tables, got {r['sources']!r}")
    sources = []
    for i, s in enumerate(r["sources"]):
        at = f"{where} [retrieve] sources[{i}]"
        if not isinstance(s, dict) or s.get("kind") not in _SOURCES:
            raise ValueError(f"{at}: kind must be one of {list(_SOURCES)}, got {s.get('kind') if isinstance(s, dict) else s!r}")
        args = {k: v for k, v in s.items() if k != "kind"}
        sources.append(_build(at, _SOURCES[s["kind"]], **args))
    stages.append(_build(f"{where} [retrieve]", Retrieve, sources=tuple(sources)))
    if "filter" in data:
        f = _keys(f"{where} [filter]", data["filter"], ("exclude_seen", "keep", "allow", "deny"))
        keep = tuple(_condition(f"{where} [filter] keep[{i}]", c) for i, c in enumerate(f.get("keep", [])))
        stages.append(_build(f"{where} [filter]", Filter, exclude_seen=f.get("exclude_seen", True), keep=keep, allow=f.get("allow"), deny=f.get("deny", ())))
    if "score" in data:
        s = _keys(f"{where} [score]", data["score"], ("dense", "sparse", "sequential"), ())
        stages.append(_build(
            f"{where} [score]", Score, dense=tuple(s.get("dense", ())), sparse=tuple(tuple(p) for p in s.get("sparse", ())),
            sequential=s.get("sequential", False),
        ))
    o = _keys(f"{where} [order]", data.get("order", {}), ("boosts", "diversity", "per_category", "temperature", "max_k"))
    boosts = []
    for i, b in enumerate(o.get("boosts", [])):
        at = f"{where} [order] boosts[{i}]"
        bt = _keys(at, b, ("when", "multiply", "add"), ("when",))
        boosts.append(_build(at, Boost, when=_condition(f"{at}.when", bt["when"]), multiply=bt.get("multiply", 1.0), add=bt.get("add", 0.0)))
    order_args = {k: v for k, v in o.items() if k != "boosts"}
    stages.append(_build(f"{where} [order]", Order, boosts=tuple(boosts), **order_args))
    spec = _build(where, PipelineSpec, stages=tuple(stages), context=tuple(context.items()), max_history=max_history)
    name, version = head.get("name", "pipeline"), head.get("version", "1")
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"{where} [pipeline] name: must be a non-empty string without '/', got {name!r}")
    return PipelineDeclaration(name, str(version), spec)


def declaration_to_dict(d: PipelineDeclaration) -> dict[str, Any]:
    """The inverse of `declaration_from_dict` (what a bundle's manifest stores)."""
    out: dict[str, Any] = {"pipeline": {"name": d.name, "version": d.version, "context": dict(d.spec.context)}}
    if d.spec.max_history is not None:  # left out: the models decide (a manifest before the key reads the same)
        out["pipeline"]["max_history"] = d.spec.max_history
    for stage in d.spec.stages:
        match stage:
            case Retrieve():
                out["retrieve"] = {"sources": [_source_dict(s) for s in stage.sources]}
            case Filter():
                f: dict[str, Any] = {"exclude_seen": stage.exclude_seen, "keep": [_cond_dict(c) for c in stage.keep], "deny": list(stage.deny)}
                if stage.allow is not None:
                    f["allow"] = list(stage.allow)
                out["filter"] = f
            case Score():
                out["score"] = {"dense": list(stage.dense), "sparse": [list(p) for p in stage.sparse]}
                if stage.sequential:
                    out["score"]["sequential"] = stage.sequential
            case Order():
                o: dict[str, Any] = {
                    "boosts": [{"when": _cond_dict(b.when), "multiply": b.multiply, "add": b.add} for b in stage.boosts],
                    "max_k": stage.max_k,
                }
                for key in ("diversity", "per_category", "temperature"):
                    if getattr(stage, key) is not None:
                        o[key] = getattr(stage, key)
                out["order"] = o
    return out


def _source_dict(s: Source) -> dict[str, Any]:
    match s:
        case Ann():
            return {"kind": "ann", "k": s.k}
        case ItemToItem():
            return {"kind": "item_to_item", "k": s.k, "last": s.last}
        case Popular():
            return {"kind": "popular", "k": s.k, **({} if s.cold_k is None else {"cold_k": s.cold_k})}
        case Sequential():
            return {"kind": "sequential", "k": s.k}


def _cond_dict(c: Condition) -> dict[str, Any]:
    return {"column": c.column, "op": c.op, "value": list(c.value) if isinstance(c.value, tuple) else c.value}
