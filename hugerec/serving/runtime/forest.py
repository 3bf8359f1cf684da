"""A trained forest as flat arrays, scored by one Numba kernel: the compiled path of a served GBM.

    forest = Forest.from_lightgbm(text)      # LightGBM's text model (Booster.model_to_string / model.txt)
    forest = Forest.from_xgboost(json_dict)   # XGBoost's JSON model (Booster.save_model("model.json"))
    forest.margin(x)                          # x [B, F] float32 (NaN: missing) -> raw scores [B] float64
    forest.margin_columns(xt)                 # the same from feature-major columns xt [F, B] float32

The libraries' decision rules:

  LightGBM  numerical: NaN -> 0.0 unless missing_type is NaN; missing (NaN, or |x| <= 1e-35 when
            missing_type is Zero) -> the default child; else x <= threshold (float64) goes left.
            categorical: NaN or a negative value -> right; int(x) in the node's bitset -> left.
  XGBoost   NaN -> the default child; numerical: x < threshold (float32) goes left; categorical:
            int(x) in the node's category set -> right, any other value -> left.

are folded, when the model is read, into one rule per node that the kernel applies to float32 inputs:

  NaN -> left if the node's NAN_LEFT flag is set, else right (LightGBM's "NaN as 0.0" is decided then);
  categorical (flag CATEGORICAL): int(x) in the bitset -> left, anything else -> right (XGBoost's
  categorical nodes have their children swapped); |x| <= 1e-35 with flag ZERO_MISSING -> as NaN;
  numerical: x <= t -> left, with t the float32 that makes this exact: the largest float32 <= LightGBM's
  float64 threshold, the float32 just below XGBoost's (x < t  <=>  x <= nextafter(t, -inf)).

Layout (16 bytes per inner node, 4 to a cache line): nodes [M, 4] int32 = (feature | flags << 24,
threshold bits or bitset offset, left, right); a child >= 0 is an inner node, ~k the leaf k, whose value
is leaves[k] (float64). A bitset is stored as its word count, then its uint32 words, in `cat_bits`.
Blocks of rows go through one tree after the other, so a tree's nodes stay in cache while every row of
the block reads them; batches of PARALLEL_ROWS rows or more are split over Numba's threads.

The sum (float64, in tree order) starts at the base score (XGBoost's base_score as a margin; LightGBM
folds it into the first tree). `margin_reference` is the NumPy spec of the kernel; the libraries' own
predict is the reference of the whole: tests/serving/runtime/test_gbm_model.py compares all three.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import njit, prange

NUMERICAL, CATEGORICAL, LEAF = 0, 1, 2  # node kinds while a model is read
MISSING_AS_ZERO, MISSING_ZERO_OR_NAN, MISSING_NAN = 0, 1, 2  # how a LightGBM node treats NaN (and zero)
LIGHTGBM, XGBOOST = 0, 1
_ZERO = 1e-35  # LightGBM's kZeroThreshold
# flags of a node in the kernel's layout (bits 24.. of nodes[:, 0]; the feature index is bits 0..23)
FLAG_CATEGORICAL, FLAG_NAN_LEFT, FLAG_ZERO_MISSING = 1, 2, 4
_FEATURE_MASK = (1 << 24) - 1
_BLOCK = 64  # rows that go through a tree together
PARALLEL_ROWS = 128  # smaller batches stay in the calling thread (a parallel launch costs more than it saves)
_CAT_LIMIT = float(1 << 31)  # ids at or above this are in no bitset (and would overflow the int cast)


@dataclass(frozen=True, eq=False)
class Forest:
    """Flat trees in the kernel's layout: roots [T] int32 (~k: a one-leaf tree), nodes [M, 4] int32,
    leaves [L] float64, cat_bits [K] uint32 (see the module docstring)."""

    library: int
    roots: np.ndarray
    nodes: np.ndarray
    leaves: np.ndarray
    cat_bits: np.ndarray
    base: float
    num_features: int

    @property
    def num_trees(self) -> int:
        return int(self.roots.shape[0])

    @property
    def thresholds(self) -> np.ndarray:
        """[M] float32: each numerical node's threshold (the bits of nodes[:, 1])."""
        return self.nodes[:, 1].view(np.float32)

    @property
    def flags(self) -> np.ndarray:
        """[M] int32: FLAG_* of each inner node."""
        return self.nodes[:, 0] >> 24

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the kernels read, in their argument order."""
        return self.roots, self.nodes, self.nodes.view(np.float32), self.leaves, self.cat_bits

    def margin(self, x: np.ndarray) -> np.ndarray:
        """Raw scores [B] float64 for x [B, num_features] (float32 or float64; NaN: missing)."""
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"Forest.margin: x must be [B, {self.num_features}], got {list(x.shape)}")
        return self.margin_columns(np.ascontiguousarray(x.T, np.float32))

    def margin_columns(self, xt: np.ndarray) -> np.ndarray:
        """Raw scores [B] float64 for feature-major rows xt [num_features, B] float32, C-contiguous
        (the layout the kernel reads; GBMModel builds it without a transpose)."""
        if xt.ndim != 2 or xt.shape[0] != self.num_features or xt.dtype != np.float32 or not xt.flags.c_contiguous:
            raise ValueError(
                f"Forest.margin_columns: xt must be C-contiguous float32 [{self.num_features}, B], got "
                f"{xt.dtype} {list(xt.shape)}"
            )
        b = xt.shape[1]
        out = np.empty(b, np.float64)
        if b >= PARALLEL_ROWS and numba.get_num_threads() > 1:
            chunks = -(-b // _BLOCK)
            _score_parallel(xt, *self._arrays(), self.base, chunks, out)
        else:
            _score(xt, *self._arrays(), self.base, 0, b, out)
        return out

    # -- LightGBM ---------------------------------------------------------------------------------
    @staticmethod
    def from_lightgbm(text: str) -> Forest:
        """LightGBM's text model -> Forest; ValueError for what the kernel does not score (linear trees,
        several classes, a sigmoid other than 1)."""
        header, trees = _lightgbm_blocks(text)
        if int(header.get("num_class", "1")) != 1 or int(header.get("num_tree_per_iteration", "1")) != 1:
            raise ValueError("Forest.from_lightgbm: only models with one output (binary, regression, ranking)")
        objective = header.get("objective", "")
        if "sigmoid:" in objective and not objective.endswith("sigmoid:1"):
            raise ValueError(f"Forest.from_lightgbm: objective {objective!r}: only sigmoid:1 is scored as a logit")
        b = _Builder()
        for t, tree in enumerate(trees):
            if tree.get("is_linear", "0") != "0":
                raise ValueError(f"Forest.from_lightgbm: tree {t} is a linear tree")
            leaves = _floats(tree["leaf_value"])
            if int(tree["num_leaves"]) == 1:
                b.roots.append(b.leaf(leaves[0]))
                continue
            feature = _ints(tree["split_feature"])
            threshold = _floats(tree["threshold"])
            decision = _ints(tree["decision_type"])
            left, right = _ints(tree["left_child"]), _ints(tree["right_child"])
            boundaries = _ints(tree.get("cat_boundaries", ""))
            bits = _ints(tree.get("cat_threshold", ""))
            n_inner = len(feature)
            base = len(b.kind)  # inner nodes first, then the leaves: child k >= 0 -> base + k, ~k -> leaf k
            first_leaf = base + n_inner

            def child(c: int, base: int = base, first_leaf: int = first_leaf) -> int:
                return base + c if c >= 0 else first_leaf + ~c

            for k in range(n_inner):
                d = decision[k]
                if d & 1:  # categorical: threshold is the index of the node's bitset
                    cat = int(threshold[k])
                    words = bits[boundaries[cat] : boundaries[cat + 1]]
                    b.inner(CATEGORICAL, feature[k], 0.0, child(left[k]), child(right[k]), False, MISSING_NAN, words)
                else:
                    missing = (MISSING_AS_ZERO, MISSING_ZERO_OR_NAN, MISSING_NAN)[(d >> 2) & 3]
                    b.inner(NUMERICAL, feature[k], threshold[k], child(left[k]), child(right[k]), bool(d & 2), missing)
            for v in leaves:
                b.leaf(v)
            b.roots.append(base)
        return b.build(LIGHTGBM, 0.0, int(header["max_feature_idx"]) + 1)

    # -- XGBoost ----------------------------------------------------------------------------------
    @staticmethod
    def from_xgboost(model: Mapping[str, Any]) -> Forest:
        """XGBoost's JSON model (as a dict) -> Forest; ValueError for what the kernel does not score."""
        try:
            learner = model["learner"]
            booster = learner["gradient_booster"]
            if booster.get("name") != "gbtree":
                raise ValueError(f"Forest.from_xgboost: booster {booster.get('name')!r}; only gbtree is scored")
            params = learner["learner_model_param"]
            if int(params.get("num_class", "0")) > 1 or int(params.get("num_target", "1")) > 1:
                raise ValueError("Forest.from_xgboost: only models with one output")
            trees = booster["model"]["trees"]
            objective = learner["objective"]["name"]
            num_features = int(params["num_feature"])
            base_score = float(str(params["base_score"]).strip("[]"))
        except (KeyError, TypeError) as e:
            raise ValueError(f"Forest.from_xgboost: not an XGBoost JSON model (missing {e})") from None
        # logistic objectives keep the base score as a probability: the sum starts at its logit
        logistic = objective in ("binary:logistic", "reg:logistic")
        base = math.log(base_score / (1.0 - base_score)) if logistic else base_score
        b = _Builder()
        for tree in trees:
            left, right = tree["left_children"], tree["right_children"]
            feature, cond = tree["split_indices"], tree["split_conditions"]
            default_left, split_type = tree["default_left"], tree.get("split_type", [0] * len(left))
            cats: dict[int, list[int]] = {}
            for node, start, size in zip(
                tree.get("categories_nodes", []), tree.get("categories_segments", []), tree.get("categories_sizes", []),
                strict=True,
            ):
                cats[int(node)] = [int(c) for c in tree["categories"][start : start + size]]
            base_index = len(b.kind)
            for n in range(len(left)):
                if left[n] == -1:
                    b.leaf(float(cond[n]))
                    continue
                lc, rc = base_index + int(left[n]), base_index + int(right[n])
                if split_type[n] == 1:
                    values = cats.get(n, [])
                    words = np.zeros((max(values) // 32 + 1) if values else 0, np.int64)
                    for c in values:
                        words[c // 32] |= 1 << (c % 32)
                    b.inner(CATEGORICAL, int(feature[n]), 0.0, lc, rc, bool(default_left[n]), MISSING_NAN, list(words))
                else:
                    threshold = float(np.float32(cond[n]))
                    b.inner(NUMERICAL, int(feature[n]), threshold, lc, rc, bool(default_left[n]), MISSING_NAN)
            b.roots.append(base_index)
        return b.build(XGBOOST, base, num_features)

    @staticmethod
    def from_xgboost_json(text: str | bytes) -> Forest:
        return Forest.from_xgboost(json.loads(text))


class _Builder:
    def __init__(self) -> None:
        self.roots: list[int] = []
        self.kind: list[int] = []
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.default_left: list[bool] = []
        self.missing: list[int] = []
        self.value: list[float] = []
        self.cat_start: list[int] = []
        self.cat_words: list[int] = []
        self.cat_bits: list[int] = []

    def inner(
        self,
        kind: int,
        feature: int,
        threshold: float,
        left: int,
        right: int,
        default_left: bool,
        missing: int,
        words: list[int] | None = None,
    ) -> int:
        words = words or []
        self.cat_start.append(len(self.cat_bits))
        self.cat_words.append(len(words))
        self.cat_bits.extend(int(w) & 0xFFFFFFFF for w in words)
        return self._node(kind, feature, threshold, left, right, default_left, missing, 0.0)

    def leaf(self, value: float) -> int:
        self.cat_start.append(0)
        self.cat_words.append(0)
        return self._node(LEAF, 0, 0.0, -1, -1, False, MISSING_NAN, value)

    def _node(
        self, kind: int, feature: int, threshold: float, left: int, right: int, default_left: bool, missing: int, value: float
    ) -> int:
        self.kind.append(kind)
        self.feature.append(feature)
        self.threshold.append(threshold)
        self.left.append(left)
        self.right.append(right)
        self.default_left.append(default_left)
        self.missing.append(missing)
        self.value.append(value)
        return len(self.kind) - 1

    def build(self, library: int, base: float, num_features: int) -> Forest:
        """The kernel's layout: each node's rule folded into flags and a float32 threshold (module docstring)."""
        kind = np.asarray(self.kind, np.uint8)
        f = np.asarray(self.feature, np.int64)
        inner = kind != LEAF
        if inner.any() and (f[inner].min() < 0 or f[inner].max() >= num_features):
            raise ValueError(f"Forest: a split reads feature {int(f[inner].max())} of a model with {num_features}")
        if num_features > _FEATURE_MASK:
            raise ValueError(f"Forest: {num_features} features; the layout holds at most {_FEATURE_MASK}")
        # builder index -> inner node index (>= 0) or ~leaf index
        slot = np.where(inner, np.cumsum(inner) - 1, ~(np.cumsum(~inner) - 1)).astype(np.int64)
        nodes = np.zeros((int(inner.sum()), 4), np.int32)
        floats = nodes.view(np.float32)
        cat_bits: list[int] = []
        for n in np.flatnonzero(inner):
            k = slot[n]
            left, right = int(slot[self.left[n]]), int(slot[self.right[n]])
            default_left, missing = self.default_left[n], self.missing[n]
            if kind[n] == CATEGORICAL:
                flags = FLAG_CATEGORICAL
                if library == XGBOOST:  # in the set -> right: swap, so that the set sends left as LightGBM's does
                    left, right = right, left
                    flags |= 0 if default_left else FLAG_NAN_LEFT
                words = self.cat_bits[self.cat_start[n] : self.cat_start[n] + self.cat_words[n]]
                nodes[k, 1] = len(cat_bits)
                cat_bits += [len(words), *words]
            else:
                t64 = self.threshold[n]
                if library == LIGHTGBM:
                    t = np.float32(t64)
                    if float(t) > t64:  # the largest float32 <= t64: x <= t  <=>  x <= t64 for every float32 x
                        t = np.nextafter(t, np.float32(-np.inf))
                    nan_left = default_left if missing != MISSING_AS_ZERO else t64 >= 0.0
                    zero = FLAG_ZERO_MISSING if missing == MISSING_ZERO_OR_NAN else 0
                    flags = (FLAG_NAN_LEFT if nan_left else 0) | zero
                else:
                    t = np.nextafter(np.float32(t64), np.float32(-np.inf))  # x < t64  <=>  x <= t
                    flags = FLAG_NAN_LEFT if default_left else 0
                floats[k, 1] = t
            nodes[k, 0] = int(f[n]) | (flags << 24)
            nodes[k, 2], nodes[k, 3] = left, right
        return Forest(
            library=library,
            roots=slot[np.asarray(self.roots, np.int64)].astype(np.int32),
            nodes=nodes,
            leaves=np.asarray(self.value, np.float64)[~inner],
            cat_bits=np.asarray(cat_bits, np.uint32),
            base=float(base),
            num_features=num_features,
        )


def _lightgbm_blocks(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The header's key=value lines and one dict of key=value per `Tree=k` block."""
    header: dict[str, str] = {}
    trees: list[dict[str, str]] = []
    current = header
    for line in text.splitlines():
        if line.startswith("end of trees"):
            break
        if line.startswith("Tree="):
            current = {}
            trees.append(current)
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if "max_feature_idx" not in header or not trees:
        raise ValueError("Forest.from_lightgbm: not a LightGBM text model (no header or no trees)")
    return header, trees


def _floats(s: str) -> list[float]:
    return [float(v) for v in s.split()]


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split()]


def margin_reference(forest: Forest, x: np.ndarray) -> np.ndarray:
    """The kernel's spec in NumPy: every row of x [B, F] walks each tree in step (raw scores [B] float64)."""
    x = np.asarray(x, np.float32)
    rows = np.arange(x.shape[0])
    feature = forest.nodes[:, 0] & _FEATURE_MASK
    flags, thresholds = forest.flags, forest.thresholds
    out = np.full(x.shape[0], forest.base, np.float64)
    for root in forest.roots:
        n = np.full(x.shape[0], root, np.int64)
        while (live := n >= 0).any():
            i, k = rows[live], n[live]
            v, fl = x[i, feature[k]], flags[k]
            nan = np.isnan(v)
            right = ~((fl & FLAG_NAN_LEFT) > 0)  # NaN, and zero where it counts as missing
            numerical = ~nan & ((fl & FLAG_CATEGORICAL) == 0)
            zero = numerical & ((fl & FLAG_ZERO_MISSING) > 0) & (np.abs(v) <= _ZERO)
            plain = numerical & ~zero
            right[plain] = v[plain] > thresholds[k[plain]]
            for j in np.flatnonzero(~nan & ((fl & FLAG_CATEGORICAL) > 0)):
                right[j] = not _in_bitset(forest.cat_bits, int(forest.nodes[k[j], 1]), float(v[j]))
            n[live] = forest.nodes[k, 2 + right.astype(np.int64)]
        out += forest.leaves[~n]
    return out


def _in_bitset(cat_bits: np.ndarray, start: int, v: float) -> bool:
    if v < 0.0 or v >= _CAT_LIMIT:
        return False
    c = int(v)
    return c >> 5 < int(cat_bits[start]) and bool((int(cat_bits[start + 1 + (c >> 5)]) >> (c & 31)) & 1)


@njit(nogil=True, cache=True)
def _score(  # pragma: no cover - compiled
    xt: np.ndarray,
    roots: np.ndarray,
    nodes: np.ndarray,
    floats: np.ndarray,
    leaves: np.ndarray,
    cat_bits: np.ndarray,
    base: float,
    first: int,
    last: int,
    out: np.ndarray,
) -> None:
    """out[i] = base + the leaf value of row xt[:, i] in every tree (summed in tree order) for i in
    first..last - 1 (the rule of the module docstring; `floats` is `nodes` seen as float32).

    Blocks of _BLOCK rows go through one tree after the other, so that the tree's nodes stay in cache
    while every row of the block reads them; the common step (a numerical node) has no branch."""
    for start in range(first, last, _BLOCK):
        stop = min(last, start + _BLOCK)
        for i in range(start, stop):
            out[i] = base
        for t in range(roots.shape[0]):
            root = roots[t]
            for i in range(start, stop):
                n = root
                while n >= 0:
                    head = nodes[n, 0]
                    v = xt[head & _FEATURE_MASK, i]
                    flags = head >> 24
                    if flags & (FLAG_CATEGORICAL | FLAG_ZERO_MISSING) == 0:
                        right = (v > floats[n, 1]) | (np.isnan(v) & (flags & FLAG_NAN_LEFT == 0))
                    elif np.isnan(v) or (flags & FLAG_ZERO_MISSING and abs(v) <= _ZERO):
                        right = flags & FLAG_NAN_LEFT == 0
                    elif flags & FLAG_CATEGORICAL:
                        right = True
                        if v >= 0.0 and v < _CAT_LIMIT:
                            c = np.int64(v)
                            s = nodes[n, 1]
                            w = c >> 5
                            if w < cat_bits[s] and (cat_bits[s + 1 + w] >> np.uint32(c & 31)) & 1:
                                right = False
                    else:
                        right = v > floats[n, 1]
                    n = nodes[n, 2 + np.int64(right)]
                out[i] += leaves[~n]


@njit(nogil=True, cache=True, parallel=True)
def _score_parallel(  # pragma: no cover - compiled
    xt: np.ndarray,
    roots: np.ndarray,
    nodes: np.ndarray,
    floats: np.ndarray,
    leaves: np.ndarray,
    cat_bits: np.ndarray,
    base: float,
    chunks: int,
    out: np.ndarray,
) -> None:
    """_score over `chunks` blocks of _BLOCK rows, the blocks shared out among Numba's threads."""
    b = xt.shape[1]
    for c in prange(chunks):
        _score(xt, roots, nodes, floats, leaves, cat_bits, base, c * _BLOCK, min(b, (c + 1) * _BLOCK), out)
