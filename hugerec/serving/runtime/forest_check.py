"""The checks every tree of a model file passes before it is flattened into a Forest, so that nothing a
file says can make the loader raise an unnamed error or the scoring kernel read out of bounds or loop.

    check_lightgbm_tree(where, t, num_features, tree)    # LightGBM text: one `Tree=t` block's key=value
    check_xgboost_tree(where, t, num_features, tree)     # XGBoost JSON: one element of "trees"
    check_tree_sizes(raw, where)                         # LightGBM's tree_sizes= against the blocks
    xgboost_base_margin(objective, base_score, where)    # base_score through the objective's link
    check_forest(forest, where)                          # the kernel's arrays (every Forest, at creation)

A tree passes when its arrays have the lengths its node count says, every child index is in range,
each node is reached exactly once walking from the root (no cycle, no shared subtree; XGBoost's pruned
nodes, which its files keep, are the only nodes left unreached, as many as its num_deleted says), no
leaf is deeper than MAX_DEPTH inner nodes, every split reads a feature the model has, thresholds are
numbers (not NaN), category bitsets and their offsets are in range, and leaf values are finite. A
refusal is a ModelFileError (a ValueError) of one line: the file, the tree, the node, what is wrong.

`check_forest` repeats the structural checks on the flat arrays (vectorised, one step per tree level):
what the kernel reads is checked whatever built it. The kernel also stops a walk after MAX_DEPTH steps,
so arrays that skipped every check still cannot make it loop for ever (forest.py).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from hugerec.serving.runtime.forest import Forest

MAX_DEPTH = 1024  # inner nodes on the path from a root to a leaf; also the kernel's step bound per tree
MAX_CATEGORY = (1 << 24) - 1  # largest category value a split may hold (ids are exact float32 up to 2^24)
MAX_BITSET_WORDS = 1 << 26  # uint32 words of all category bitsets together (256 MiB)
MAX_FEATURES = (1 << 24) - 1  # the layout keeps the feature index in 24 bits
T = TypeVar("T")


class ModelFileError(ValueError):
    """A model file the forest refuses: one line naming the file, the tree (and node) and what is wrong."""


# -- reading fields -------------------------------------------------------------------------------------
def text_field(block: Mapping[str, str], key: str, parse: Callable[[str], T], where: str, default: str | None = None) -> list[T]:
    """The space-separated values of `key=` in a LightGBM block, each through `parse` (int or float)."""
    raw = block.get(key, default)
    if raw is None:
        raise ModelFileError(f"{where}: no {key}= line (a truncated or damaged model file?)")
    try:
        return [parse(v) for v in raw.split()]
    except (ValueError, OverflowError) as e:
        raise ModelFileError(f"{where}: {key}= is not a list of {parse.__name__}s ({shorten(e)})") from None


def text_int(block: Mapping[str, str], key: str, where: str, default: str | None = None) -> int:
    values = text_field(block, key, int, where, default)
    if len(values) != 1:
        raise ModelFileError(f"{where}: {key}= must be one integer, got {len(values)} values")
    return values[0]


def json_ints(tree: Mapping[str, Any], key: str, n: int, where: str, default: list[int] | None = None) -> list[int]:
    """tree[key] as n integers (JSON booleans count as 0/1, as XGBoost writes default_left)."""
    values = tree.get(key, default)
    if not isinstance(values, list) or len(values) != n:
        raise ModelFileError(f"{where}: {key} must be a list of {n} integers, got {_kind(values)}")
    try:  # NumPy types the whole list in C: integers (and booleans) only give an integer array
        array = np.asarray(values)
    except (ValueError, OverflowError, TypeError):
        array = np.asarray([], np.float64)
    if n == 0:
        return []
    if array.ndim == 1 and array.dtype.kind in "iub" and array.shape[0] == n:
        out: list[int] = array.astype(np.int64).tolist()
        return out
    bad = next((v for v in values if type(v) not in (int, bool)), None)
    if bad is None:  # Python integers, some beyond 64 bits
        big = next((v for v in values if not -(1 << 63) <= v < 1 << 63), values[0])
        raise ModelFileError(f"{where}: {key} holds {shorten(big)}, beyond a 64-bit integer")
    raise ModelFileError(f"{where}: {key} holds {shorten(bad)}, not an integer")


def json_floats(tree: Mapping[str, Any], key: str, n: int, where: str) -> list[float]:
    """tree[key] as n floats (a JSON integer too; one beyond float64 is refused)."""
    values = tree.get(key)
    if not isinstance(values, list) or len(values) != n:
        raise ModelFileError(f"{where}: {key} must be a list of {n} numbers, got {_kind(values)}")
    try:
        return [float(v) if type(v) in (int, float) else _not_a_number(v) for v in values]
    except (OverflowError, TypeError) as e:
        raise ModelFileError(f"{where}: {key}: {shorten(e)}") from None


def _not_a_number(v: object) -> float:
    raise TypeError(f"{shorten(v)} is not a number")


def _kind(v: object) -> str:
    return f"a list of {len(v)}" if isinstance(v, list) else type(v).__name__


def shorten(v: object, limit: int = 80) -> str:
    s = " ".join(str(v).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


# -- one tree, in the file's own numbering --------------------------------------------------------------
@dataclass(frozen=True)
class LightGBMTree:
    """A checked LightGBM tree: inner nodes 0..n-1 (children >= 0 inner, ~k the leaf k), its leaves, and
    the category bitset words of each categorical node (empty for a numerical one)."""

    feature: list[int]
    threshold: list[float]
    decision: list[int]
    left: list[int]
    right: list[int]
    leaves: list[float]
    words: list[list[int]]


def check_lightgbm_tree(where: str, t: int, num_features: int, tree: Mapping[str, str]) -> LightGBMTree:
    """One `Tree=t` block of a LightGBM text model, checked (see the module docstring)."""
    at = f"{where}: tree {t}"
    num_leaves = text_int(tree, "num_leaves", at)
    if num_leaves < 1:
        raise ModelFileError(f"{at}: num_leaves={num_leaves}; a tree has at least one leaf")
    leaves = text_field(tree, "leaf_value", float, at)
    if len(leaves) != num_leaves:
        raise ModelFileError(f"{at}: leaf_value= has {len(leaves)} values for num_leaves={num_leaves}")
    for k, v in enumerate(leaves):
        if not math.isfinite(v):
            raise ModelFileError(f"{at} leaf {k}: value {v} is not finite")
    n = num_leaves - 1
    if n == 0:
        return LightGBMTree([], [], [], [], [], leaves, [])
    fields = {key: text_field(tree, key, int, at) for key in ("split_feature", "decision_type", "left_child", "right_child")}
    threshold = text_field(tree, "threshold", float, at)
    for key, count in (*((k, len(v)) for k, v in fields.items()), ("threshold", len(threshold))):
        if count != n:
            raise ModelFileError(f"{at}: {key}= has {count} values for {n} inner nodes (num_leaves={num_leaves})")
    feature, decision = fields["split_feature"], fields["decision_type"]
    left, right = fields["left_child"], fields["right_child"]
    boundaries = text_field(tree, "cat_boundaries", int, at, "")
    bits = text_field(tree, "cat_threshold", int, at, "")
    if boundaries and (boundaries[0] != 0 or boundaries[-1] != len(bits) or any(b > c for b, c in itertools.pairwise(boundaries))):
        raise ModelFileError(f"{at}: cat_boundaries= must rise from 0 to the {len(bits)} words of cat_threshold=")
    if any(not 0 <= w < 1 << 32 for w in bits):
        raise ModelFileError(f"{at}: cat_threshold= holds a value outside 0..2^32-1")
    words: list[list[int]] = []
    for k in range(n):
        node = f"{at} node {k}"
        _feature_in_range(node, feature[k], num_features)
        d = decision[k]
        if not 0 <= d < 16 or (d >> 2) & 3 == 3:
            raise ModelFileError(f"{node}: decision_type {d} is not a LightGBM decision type")
        for side, c in (("left", left[k]), ("right", right[k])):
            if not (c < n if c >= 0 else ~c < num_leaves):
                raise ModelFileError(
                    f"{node}: {side} child {c} is out of range (the tree has {n} inner nodes 0..{n - 1} and "
                    f"{num_leaves} leaves -1..{-num_leaves})"
                )
        if d & 1:  # categorical: the threshold is the index of the node's bitset
            cat = threshold[k]
            if not (cat.is_integer() and 0 <= cat < len(boundaries) - 1):
                raise ModelFileError(f"{node}: categorical split names bitset {cat}; the tree has {max(len(boundaries) - 1, 0)}")
            words.append(bits[boundaries[int(cat)] : boundaries[int(cat) + 1]])
        else:
            if math.isnan(threshold[k]):
                raise ModelFileError(f"{node}: threshold is NaN")
            words.append([])
    # nodes of the walk: inner k -> k, leaf ~c -> n + ~c
    _walk(at, [c if c >= 0 else n + ~c for c in left], [c if c >= 0 else n + ~c for c in right], n, n + num_leaves, 0,
          lambda i: f"node {i}" if i < n else f"leaf {i - n}")
    return LightGBMTree(feature, threshold, decision, left, right, leaves, words)


@dataclass(frozen=True)
class XGBoostTree:
    """A checked XGBoost tree: its reached nodes in file order (`order`; pruned nodes left out), and per
    node id: leaf or not, children, feature, threshold or leaf value, default direction, categories."""

    order: list[int]
    leaf: list[bool]
    left: list[int]
    right: list[int]
    feature: list[int]
    condition: list[float]
    default_left: list[int]
    categorical: list[bool]
    categories: dict[int, np.ndarray]  # node -> its category values, int64 [K]


def check_xgboost_tree(where: str, t: int, num_features: int, tree: Mapping[str, Any]) -> XGBoostTree:
    """One element of an XGBoost JSON model's "trees", checked (see the module docstring)."""
    at = f"{where}: tree {t}"
    if not isinstance(tree, Mapping):
        raise ModelFileError(f"{at}: a tree must be a JSON object, got {type(tree).__name__}")
    left_raw = tree.get("left_children")
    if not isinstance(left_raw, list) or not left_raw:
        raise ModelFileError(f"{at}: left_children must be a non-empty list, got {_kind(left_raw)}")
    n = len(left_raw)
    left, right = json_ints(tree, "left_children", n, at), json_ints(tree, "right_children", n, at)
    feature = json_ints(tree, "split_indices", n, at)
    condition = json_floats(tree, "split_conditions", n, at)
    default_left = json_ints(tree, "default_left", n, at)
    split_type = json_ints(tree, "split_type", n, at, [0] * n)
    leaf = [c == -1 for c in left]
    for k in range(n):
        node = f"{at} node {k}"
        if leaf[k]:
            continue
        for side, c in (("left", left[k]), ("right", right[k])):
            if not 0 <= c < n:
                raise ModelFileError(f"{node}: {side} child {c} is out of range (the tree has nodes 0..{n - 1})")
        _feature_in_range(node, feature[k], num_features)
        if split_type[k] not in (0, 1):
            raise ModelFileError(f"{node}: split_type {split_type[k]} is neither numerical (0) nor categorical (1)")
        if default_left[k] not in (0, 1):
            raise ModelFileError(f"{node}: default_left {default_left[k]} is neither 0 nor 1")
    categories = _xgboost_categories(at, tree, n, leaf, split_type)
    params = tree.get("tree_param", {})
    deleted = params.get("num_deleted", "0") if isinstance(params, Mapping) else "0"
    try:
        num_deleted = int(deleted)
    except (TypeError, ValueError):
        raise ModelFileError(f"{at}: tree_param.num_deleted {shorten(deleted)!r} is not an integer") from None
    seen = _walk(at, left, right, -1, n, num_deleted, lambda i: f"node {i}", leaf)
    order = [k for k in range(n) if seen[k]]
    for k in order:
        v = condition[k]
        if leaf[k] and not math.isfinite(v):
            raise ModelFileError(f"{at} node {k}: leaf value {v} is not finite")
        if not leaf[k] and split_type[k] == 0 and math.isnan(v):
            raise ModelFileError(f"{at} node {k}: threshold is NaN")
    return XGBoostTree(order, leaf, left, right, feature, condition, default_left, [s == 1 for s in split_type], categories)


def _xgboost_categories(at: str, tree: Mapping[str, Any], n: int, leaf: list[bool], split_type: list[int]) -> dict[int, np.ndarray]:
    """node -> its category values (int64 [K]), from categories_nodes / _segments / _sizes over categories."""
    keys = ("categories_nodes", "categories_segments", "categories_sizes")
    m = len(tree.get("categories_nodes", []) or [])
    nodes, starts, sizes = (json_ints(tree, key, m, at, []) for key in keys)
    values_raw = tree.get("categories", [])
    count = len(values_raw) if isinstance(values_raw, list) else -1
    values = np.asarray(json_ints(tree, "categories", count, at, []), np.int64)
    out: dict[int, np.ndarray] = {}
    for node, start, size in zip(nodes, starts, sizes, strict=True):
        if not (0 <= node < n) or leaf[node] or split_type[node] != 1:
            raise ModelFileError(f"{at}: categories_nodes names node {node}, which is not a categorical split")
        if node in out:
            raise ModelFileError(f"{at} node {node}: listed twice in categories_nodes")
        if start < 0 or size < 0 or start + size > len(values):
            raise ModelFileError(f"{at} node {node}: categories {start}..{start + size} beyond the {len(values)} listed")
        cats = values[start : start + size]
        bad = (cats < 0) | (cats > MAX_CATEGORY)
        if bad.any():
            raise ModelFileError(f"{at} node {node}: category {int(cats[bad][0])} is outside 0..{MAX_CATEGORY}")
        out[node] = cats
    return out


def _feature_in_range(node: str, f: int, num_features: int) -> None:
    if not 0 <= f < num_features:
        raise ModelFileError(f"{node}: splits on feature {f}; the model has features 0..{num_features - 1}")


def _walk(
    at: str,
    left: Sequence[int],
    right: Sequence[int],
    inner: int,
    total: int,
    may_skip: int,
    name: Callable[[int], str],
    leaf: Sequence[bool] | None = None,
) -> list[bool]:
    """Walk a tree from node 0: each node reached once, no leaf deeper than MAX_DEPTH inner nodes, every
    node reached except at most `may_skip` (pruned ones). Nodes < `inner` are inner nodes (or those not
    `leaf`); returns which nodes were reached."""
    seen = [False] * total
    seen[0] = True
    stack = [(0, 1)]
    while stack:
        k, depth = stack.pop()
        if (k >= inner) if leaf is None else leaf[k]:
            continue
        if depth > MAX_DEPTH:
            raise ModelFileError(f"{at} {name(k)}: the tree is deeper than {MAX_DEPTH} levels (MAX_DEPTH)")
        for side, c in (("left", left[k]), ("right", right[k])):
            if seen[c]:
                what = "the node itself" if c == k else f"{name(c)}, already reached from the root"
                raise ModelFileError(f"{at} {name(k)}: {side} child is {what} (a cycle or a shared subtree)")
            seen[c] = True
            stack.append((c, depth + 1))
    unreached = total - sum(seen)
    if unreached > may_skip:
        first = seen.index(False)
        raise ModelFileError(f"{at} {name(first)}: not reached from the root ({unreached} nodes are not)")
    return seen


# -- the whole model ------------------------------------------------------------------------------------
_TREE_LINE = re.compile(rb"^Tree=", re.M)


def check_tree_sizes(raw: bytes, where: str) -> None:
    """LightGBM's header line tree_sizes= gives the byte length of each Tree= block, and its parser
    trusts it; it must match the blocks the file holds (when the line is there)."""
    m = re.search(rb"^tree_sizes=(.*)$", raw[: raw.find(b"\nTree=") + 1 or len(raw)], re.M)
    if m is None:
        return
    try:
        sizes = [int(s) for s in m.group(1).split()]
    except ValueError:
        raise ModelFileError(f"{where}: tree_sizes= is not a list of integers") from None
    end = raw.find(b"\nend of trees")
    if end < 0:
        raise ModelFileError(f"{where}: no 'end of trees' line (a truncated model file?)")
    starts = [s.start() for s in _TREE_LINE.finditer(raw, 0, end)]
    blocks = [b - a for a, b in zip(starts, [*starts[1:], end + 1], strict=True)]
    if len(sizes) != len(blocks):
        raise ModelFileError(f"{where}: tree_sizes= lists {len(sizes)} trees, the file holds {len(blocks)}")
    for t, (said, got) in enumerate(zip(sizes, blocks, strict=True)):
        if said != got:
            raise ModelFileError(f"{where}: tree {t}: tree_sizes= says {said} bytes, the block has {got}")


# XGBoost's objectives by how base_score (stored as a prediction) becomes the margin the trees add to
_IDENTITY = {
    "reg:squarederror", "reg:squaredlogerror", "reg:pseudohubererror", "reg:absoluteerror", "reg:quantileerror",
    "binary:logitraw", "binary:hinge", "rank:ndcg", "rank:pairwise", "rank:map",
}  # fmt: skip
_LOGIT = {"binary:logistic", "reg:logistic"}
_LOG = {"count:poisson", "reg:gamma", "reg:tweedie", "survival:cox", "survival:aft"}


def xgboost_base_margin(objective: object, base_score: object, where: str) -> float:
    """XGBoost's base_score (a prediction) as the margin the trees' sum starts at: its logit for the
    logistic objectives (0 < base_score < 1), its log for the log-link ones (> 0), itself otherwise."""
    try:
        b = float(str(base_score).strip("[]"))
    except (ValueError, OverflowError):
        raise ModelFileError(f"{where}: base_score {shorten(base_score)!r} is not a number") from None
    if not math.isfinite(b):
        raise ModelFileError(f"{where}: base_score {b} is not finite")
    if objective in _LOGIT:
        if not 0.0 < b < 1.0:
            raise ModelFileError(f"{where}: base_score {b} of objective {objective}: a probability strictly between 0 and 1")
        return math.log(b / (1.0 - b))
    if objective in _LOG:
        if not b > 0.0:
            raise ModelFileError(f"{where}: base_score {b} of objective {objective} (a log link) must be > 0")
        return math.log(b)
    if objective in _IDENTITY:
        return b
    raise ModelFileError(f"{where}: objective {shorten(objective)!r} is not one the forest scores")


def check_forest(forest: Forest, where: str = "Forest") -> None:
    """The kernel's arrays: children and roots in range, each inner node and leaf reached exactly once from
    the roots within MAX_DEPTH levels, features and bitset offsets in range, finite leaves and base.
    Vectorised: one NumPy step per tree level, every tree at once."""
    from hugerec.serving.runtime.forest import FLAG_CATEGORICAL

    roots, nodes, leaves, cat_bits = forest.roots, forest.nodes, forest.leaves, forest.cat_bits
    m, n_leaves, k_bits = nodes.shape[0], leaves.shape[0], cat_bits.shape[0]
    if nodes.ndim != 2 or nodes.shape[1] != 4 or nodes.dtype != np.int32 or roots.dtype != np.int32:
        raise ModelFileError(f"{where}: nodes must be int32 [M, 4] and roots int32 [T]")
    if not math.isfinite(forest.base) or not np.isfinite(leaves).all():
        bad = int(np.flatnonzero(~np.isfinite(leaves))[0]) if not np.isfinite(leaves).all() else -1
        raise ModelFileError(f"{where}: " + (f"leaf {bad} is {leaves[bad]}" if bad >= 0 else f"base {forest.base}") + ", not finite")
    if not 0 < forest.num_features <= MAX_FEATURES:
        raise ModelFileError(f"{where}: {forest.num_features} features; the layout holds 1..{MAX_FEATURES}")
    children = nodes[:, 2:4].astype(np.int64)
    ok = np.where(children >= 0, children < m, ~children < n_leaves)
    if not ok.all():
        k = int(np.flatnonzero(~ok.all(axis=1))[0])
        raise ModelFileError(f"{where}: flat node {k}: child {list(children[k])} out of range ({m} nodes, {n_leaves} leaves)")
    r = roots.astype(np.int64)
    if not np.where(r >= 0, r < m, ~r < n_leaves).all():
        raise ModelFileError(f"{where}: a root is out of range ({m} nodes, {n_leaves} leaves)")
    feature, flags = forest.split_features, forest.flags
    if m and (int(feature.max()) >= forest.num_features or int(flags.min()) < 0 or int(flags.max()) > 15):
        k = int(np.flatnonzero((feature >= forest.num_features) | (flags < 0) | (flags > 15))[0])
        raise ModelFileError(f"{where}: flat node {k}: feature {int(feature[k])} / flags {int(flags[k])} out of range")
    categorical = np.flatnonzero(flags & FLAG_CATEGORICAL)
    if categorical.size:
        start = nodes[categorical, 1].astype(np.int64)
        inside = (start >= 0) & (start < k_bits)
        end = np.where(inside, start + 1 + cat_bits[np.where(inside, start, 0)].astype(np.int64), k_bits + 1)
        if not (end <= k_bits).all():
            k = int(categorical[np.flatnonzero(end > k_bits)[0]])
            raise ModelFileError(f"{where}: flat node {k}: its category bitset lies outside the {k_bits} words")
    numerical = np.flatnonzero((flags & FLAG_CATEGORICAL) == 0)
    if np.isnan(nodes[numerical, 1].view(np.float32)).any():
        raise ModelFileError(f"{where}: a numerical node's threshold is NaN")
    # walk every tree at once, one level per step: each node must be reached once
    visits = np.zeros(m, np.int64)
    leaf_visits = np.bincount(~r[r < 0], minlength=n_leaves)
    frontier, tree = r[r >= 0], np.flatnonzero(r >= 0)
    for _ in range(MAX_DEPTH):
        if frontier.size == 0:
            break
        np.add.at(visits, frontier, 1)
        twice = visits[frontier] > 1
        if twice.any():
            i = int(np.flatnonzero(twice)[0])
            raise ModelFileError(f"{where}: tree {int(tree[i])}: flat node {int(frontier[i])} is reached twice (a cycle or a shared subtree)")
        kids = children[frontier].reshape(-1)  # [2 * frontier]: left, right of each
        kid_tree = np.repeat(tree, 2)
        leaf_visits += np.bincount(~kids[kids < 0], minlength=n_leaves)
        frontier, tree = kids[kids >= 0], kid_tree[kids >= 0]
    if frontier.size:
        raise ModelFileError(f"{where}: tree {int(tree[0])} is deeper than {MAX_DEPTH} levels (MAX_DEPTH)")
    if (visits != 1).any() or (leaf_visits != 1).any():
        what = f"flat node {int(np.flatnonzero(visits != 1)[0])}" if (visits != 1).any() else f"leaf {int(np.flatnonzero(leaf_visits != 1)[0])}"
        raise ModelFileError(f"{where}: {what} is not reached exactly once from the roots")
