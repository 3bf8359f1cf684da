"""A trained forest as flat arrays, scored by one Numba kernel: the compiled path of a served GBM.

    forest = Forest.from_lightgbm(text)      # LightGBM's text model (Booster.model_to_string / model.txt)
    forest = Forest.from_xgboost(json_dict)   # XGBoost's JSON model (Booster.save_model("model.json"))
    forest.margin(x)                          # x [B, F] float32 (NaN: missing) -> raw scores [B] float64
    forest.margin_columns(xt)                 # the same from feature-major columns xt [F, B] float32

The libraries' decision rules:

  LightGBM  numerical: |x| <= 1e-35f -> 0.0; NaN -> 0.0 unless missing_type is NaN; missing (NaN, or
            0.0 when missing_type is Zero) -> the default child; else x <= threshold (float64) goes left.
            categorical: NaN or int(x) < 0 -> right (int() truncates: -0.5 is category 0); int(x) in
            the node's bitset -> left.
  XGBoost   NaN -> the default child; numerical: x < threshold (float32) goes left; categorical:
            int(x) in the node's category set -> right, any other value (a negative one too) -> left.

are folded, when the model is read, into one rule per node that the kernel applies to float32 inputs:

  NaN -> left if the node's NAN_LEFT flag is set, else right (LightGBM's "NaN as 0.0" is decided then);
  categorical (flag CATEGORICAL): int(x) in the bitset -> left, anything else -> right (XGBoost's
  categorical nodes have their children swapped), where x in (-1, 0) is category 0 with flag TRUNCATE
  (LightGBM's) and no category without it; |x| <= 1e-35 with flag ZERO_MISSING -> as NaN;
  numerical: x <= t -> left, with t the float32 that makes this exact: the largest float32 <= LightGBM's
  float64 threshold, moved to the edge of the band |x| <= 1e-35f on its side so that the band goes where
  0.0 goes; the float32 just below XGBoost's (x < t  <=>  x <= nextafter(t, -inf)).

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from hugerec.serving.runtime.forest_check import (
    MAX_BITSET_WORDS,
    MAX_DEPTH,
    MAX_FEATURES,
    ModelFileError,
    check_forest,
    check_lightgbm_tree,
    check_tree_sizes,
    check_xgboost_tree,
    shorten,
    text_int,
    xgboost_base_margin,
)

NUMERICAL, CATEGORICAL, LEAF = 0, 1, 2  # node kinds while a model is read
MISSING_AS_ZERO, MISSING_ZERO_OR_NAN, MISSING_NAN = 0, 1, 2  # how a LightGBM node treats NaN (and zero)
LIGHTGBM, XGBOOST = 0, 1
# LightGBM's kZeroThreshold is the float literal 1e-35f, i.e. 1.00000002e-35 as a double: its predictor
# reads every |x| <= that as 0.0 (a sparse row leaves it out), whatever the node's missing type
_ZERO = float(np.float32(1e-35))
_ZERO32 = np.float32(_ZERO)
# flags of a node in the kernel's layout (bits 24.. of nodes[:, 0]; the feature index is bits 0..23)
FLAG_CATEGORICAL, FLAG_NAN_LEFT, FLAG_ZERO_MISSING, FLAG_TRUNCATE = 1, 2, 4, 8
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
    source: str = "Forest"  # the model file (or caller) named by errors

    def __post_init__(self) -> None:
        """Check the arrays (forest_check.check_forest) and make them read-only: what the kernel reads was
        checked, and stays as checked."""
        check_forest(self, self.source)
        for a in (self.roots, self.nodes, self.leaves, self.cat_bits):
            a.flags.writeable = False

    @property
    def num_trees(self) -> int:
        return int(self.roots.shape[0])

    @property
    def thresholds(self) -> np.ndarray:
        """[M] float32: each numerical node's threshold (the bits of nodes[:, 1])."""
        return self.nodes[:, 1].view(np.float32)

    @property
    def split_features(self) -> np.ndarray:
        """[M] int32: the feature each inner node reads (bits 0..23 of nodes[:, 0])."""
        return self.nodes[:, 0] & _FEATURE_MASK

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
            unfinished = _score_parallel(xt, *self._arrays(), self.base, chunks, out)
        else:
            unfinished = _score(xt, *self._arrays(), self.base, 0, b, out)
        if unfinished:  # only arrays changed after check_forest can get here
            raise RuntimeError(f"{self.source}: {unfinished} tree walks did not reach a leaf within {MAX_DEPTH} steps")
        return out

    # -- LightGBM ---------------------------------------------------------------------------------
    @staticmethod
    def from_lightgbm(text: str, where: str = "Forest.from_lightgbm") -> Forest:
        """LightGBM's text model -> Forest; ModelFileError (a ValueError) naming `where`, the tree and the
        node for a damaged file (forest_check.py) and for what the kernel does not score (linear trees,
        several classes, a sigmoid other than 1)."""
        header, trees = _lightgbm_blocks(text, where)
        if text_int(header, "num_class", where, "1") != 1 or text_int(header, "num_tree_per_iteration", where, "1") != 1:
            raise ModelFileError(f"{where}: only models with one output (binary, regression, ranking) are scored")
        objective = header.get("objective", "")
        if "sigmoid:" in objective and not objective.endswith("sigmoid:1"):
            raise ModelFileError(f"{where}: objective {objective!r}: only sigmoid:1 is scored as a logit")
        num_features = text_int(header, "max_feature_idx", where) + 1
        if not 0 < num_features <= MAX_FEATURES:
            raise ModelFileError(f"{where}: max_feature_idx={num_features - 1}; the forest holds 1..{MAX_FEATURES} features")
        check_tree_sizes(text.encode(), where)
        b = _Builder(where)
        for t, block in enumerate(trees):
            if block.get("is_linear", "0") != "0":
                raise ModelFileError(f"{where}: tree {t} is a linear tree")
            tree = check_lightgbm_tree(where, t, num_features, block)
            if not tree.left:  # one leaf
                b.roots.append(b.leaf(tree.leaves[0]))
                continue
            base = len(b.kind)  # inner nodes first, then the leaves: child k >= 0 -> base + k, ~k -> leaf k
            first_leaf = base + len(tree.left)

            def child(c: int, base: int = base, first_leaf: int = first_leaf) -> int:
                return base + c if c >= 0 else first_leaf + ~c

            for k, d in enumerate(tree.decision):
                lc, rc, f = child(tree.left[k]), child(tree.right[k]), tree.feature[k]
                if d & 1:  # categorical: the node's bitset words (checked: in range)
                    b.inner(CATEGORICAL, f, 0.0, lc, rc, False, MISSING_NAN, tree.words[k])
                else:
                    missing = (MISSING_AS_ZERO, MISSING_ZERO_OR_NAN, MISSING_NAN)[(d >> 2) & 3]
                    b.inner(NUMERICAL, f, tree.threshold[k], lc, rc, bool(d & 2), missing)
            for v in tree.leaves:
                b.leaf(v)
            b.roots.append(base)
        return b.build(LIGHTGBM, 0.0, num_features)

    # -- XGBoost ----------------------------------------------------------------------------------
    @staticmethod
    def from_xgboost(model: Mapping[str, Any], where: str = "Forest.from_xgboost") -> Forest:
        """XGBoost's JSON model (as a dict) -> Forest; ModelFileError as for from_lightgbm."""
        try:
            learner = model["learner"]
            booster = learner["gradient_booster"]
            if booster.get("name") != "gbtree":
                raise ModelFileError(f"{where}: booster {booster.get('name')!r}; only gbtree is scored")
            params = learner["learner_model_param"]
            if int(params.get("num_class", "0")) > 1 or int(params.get("num_target", "1")) > 1:
                raise ModelFileError(f"{where}: only models with one output are scored")
            trees = booster["model"]["trees"]
            recoded = (booster["model"].get("cats") or {}).get("enc") or []
            objective = learner["objective"]["name"]
            num_features = int(params["num_feature"])
            base_score = params["base_score"]
        except ModelFileError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as e:
            raise ModelFileError(f"{where}: not an XGBoost JSON model ({type(e).__name__}: {e})") from None
        if not isinstance(trees, list):
            raise ModelFileError(f"{where}: not an XGBoost JSON model (trees is a {type(trees).__name__})")
        if recoded:
            raise ModelFileError(f"{where}: the model re-codes categories (cats.enc); the forest scores the codes themselves")
        if not 0 < num_features <= MAX_FEATURES:
            raise ModelFileError(f"{where}: num_feature {num_features}; the forest holds 1..{MAX_FEATURES} features")
        base = xgboost_base_margin(objective, base_score, where)
        b = _Builder(where)
        words_total = 0
        for t, raw in enumerate(trees):
            tree = check_xgboost_tree(where, t, num_features, raw)
            base_index = len(b.kind)
            index = {k: base_index + i for i, k in enumerate(tree.order)}  # pruned nodes left out
            for k in tree.order:
                if tree.leaf[k]:
                    b.leaf(tree.condition[k])
                    continue
                lc, rc, f, default_left = index[tree.left[k]], index[tree.right[k]], tree.feature[k], bool(tree.default_left[k])
                if tree.categorical[k]:
                    values = tree.categories.get(k, np.zeros(0, np.int64))
                    words = np.zeros(int(values.max()) // 32 + 1 if values.size else 0, np.int64)
                    words_total += words.shape[0]
                    if words_total > MAX_BITSET_WORDS:
                        raise ModelFileError(f"{where}: tree {t} node {k}: the category bitsets pass {MAX_BITSET_WORDS * 4 >> 20} MiB")
                    np.bitwise_or.at(words, values >> 5, np.left_shift(1, values & 31))
                    b.inner(CATEGORICAL, f, 0.0, lc, rc, default_left, MISSING_NAN, words.tolist())
                else:
                    b.inner(NUMERICAL, f, tree.condition[k], lc, rc, default_left, MISSING_NAN)  # float32 in _fold
            b.roots.append(base_index)
        return b.build(XGBOOST, base, num_features)

    @staticmethod
    def from_xgboost_json(text: str | bytes, where: str = "Forest.from_xgboost") -> Forest:
        try:
            model = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, too deep, a 5,000-digit integer
            raise ModelFileError(f"{where}: not JSON ({shorten(e)})") from None
        if not isinstance(model, dict):
            raise ModelFileError(f"{where}: not an XGBoost JSON model (a JSON {type(model).__name__})")
        return Forest.from_xgboost(model, where)


class _Builder:
    def __init__(self, where: str) -> None:
        self.where = where  # named by the Forest's own checks
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
        # builder index -> inner node index (>= 0) or ~leaf index
        slot = np.where(inner, np.cumsum(inner) - 1, ~(np.cumsum(~inner) - 1)).astype(np.int64)
        nodes = np.zeros((int(inner.sum()), 4), np.int32)
        floats = nodes.view(np.float32)
        cat_bits: list[int] = []
        with np.errstate(over="ignore"):  # a threshold beyond float32 becomes +-inf (still the same split)
            self._fold(library, kind, f, inner, slot, nodes, floats, cat_bits)
        return Forest(
            library=library,
            roots=slot[np.asarray(self.roots, np.int64)].astype(np.int32),
            nodes=nodes,
            leaves=np.asarray(self.value, np.float64)[~inner],
            cat_bits=np.asarray(cat_bits, np.uint32),
            base=float(base),
            num_features=num_features,
            source=self.where,
        )

    def _fold(
        self,
        library: int,
        kind: np.ndarray,
        f: np.ndarray,
        inner: np.ndarray,
        slot: np.ndarray,
        nodes: np.ndarray,
        floats: np.ndarray,
        cat_bits: list[int],
    ) -> None:
        """Fill nodes [M, 4] (floats: the same memory as float32) and cat_bits from the builder's lists."""
        for n in np.flatnonzero(inner):
            k = slot[n]
            left, right = int(slot[self.left[n]]), int(slot[self.right[n]])
            default_left, missing = self.default_left[n], self.missing[n]
            if kind[n] == CATEGORICAL:
                flags = FLAG_CATEGORICAL | (FLAG_TRUNCATE if library == LIGHTGBM else 0)
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
                    # LightGBM reads the band |x| <= _ZERO as 0.0, which goes left iff 0 <= t64; outside
                    # the band x <= t is unchanged by moving t to the band's edge on that side
                    if t64 >= 0.0:
                        t = max(t, _ZERO32)
                    else:
                        t = min(t, np.nextafter(-_ZERO32, np.float32(-np.inf)))
                    nan_left = default_left if missing != MISSING_AS_ZERO else t64 >= 0.0
                    zero = FLAG_ZERO_MISSING if missing == MISSING_ZERO_OR_NAN else 0
                    flags = (FLAG_NAN_LEFT if nan_left else 0) | zero
                else:
                    t = np.nextafter(np.float32(t64), np.float32(-np.inf))  # x < t64  <=>  x <= t
                    flags = FLAG_NAN_LEFT if default_left else 0
                floats[k, 1] = t
            nodes[k, 0] = int(f[n]) | (flags << 24)
            nodes[k, 2], nodes[k, 3] = left, right


def _lightgbm_blocks(text: str, where: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The header's key=value lines and one dict of key=value per `Tree=k` block (k = 0, 1, ... in
    order), up to the line `end of trees`, which a whole file has."""
    header: dict[str, str] = {}
    trees: list[dict[str, str]] = []
    current = header
    ended = False
    for line in text.splitlines():
        if line.startswith("end of trees"):
            ended = True
            break
        if line.startswith("Tree="):
            if line != f"Tree={len(trees)}":
                raise ModelFileError(f"{where}: {shorten(line)!r} where Tree={len(trees)} was expected")
            current = {}
            trees.append(current)
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if "max_feature_idx" not in header or not trees:
        raise ModelFileError(f"{where}: not a LightGBM text model (no header or no trees)")
    if not ended:
        raise ModelFileError(f"{where}: no 'end of trees' line after tree {len(trees) - 1} (a truncated model file?)")
    return header, trees


def margin_reference(forest: Forest, x: np.ndarray) -> np.ndarray:
    """The kernel's spec in NumPy: every row of x [B, F] walks each tree in step (raw scores [B] float64)."""
    x = np.asarray(x, np.float32)
    rows = np.arange(x.shape[0])
    feature = forest.nodes[:, 0] & _FEATURE_MASK
    flags, thresholds = forest.flags, forest.thresholds
    out = np.full(x.shape[0], forest.base, np.float64)
    for t, root in enumerate(forest.roots):
        n = np.full(x.shape[0], root, np.int64)
        for _ in range(MAX_DEPTH):
            if not (live := n >= 0).any():
                break
            i, k = rows[live], n[live]
            v, fl = x[i, feature[k]], flags[k]
            nan = np.isnan(v)
            right = ~((fl & FLAG_NAN_LEFT) > 0)  # NaN, and zero where it counts as missing
            numerical = ~nan & ((fl & FLAG_CATEGORICAL) == 0)
            zero = numerical & ((fl & FLAG_ZERO_MISSING) > 0) & (np.abs(v) <= _ZERO)
            plain = numerical & ~zero
            right[plain] = v[plain] > thresholds[k[plain]]
            for j in np.flatnonzero(~nan & ((fl & FLAG_CATEGORICAL) > 0)):
                truncate = bool(fl[j] & FLAG_TRUNCATE)
                right[j] = not _in_bitset(forest.cat_bits, int(forest.nodes[k[j], 1]), float(v[j]), truncate)
            n[live] = forest.nodes[k, 2 + right.astype(np.int64)]
        if (n >= 0).any():
            raise RuntimeError(f"margin_reference: tree {t} has a walk longer than MAX_DEPTH = {MAX_DEPTH} steps")
        out += forest.leaves[~n]
    return out


def _in_bitset(cat_bits: np.ndarray, start: int, v: float, truncate: bool) -> bool:
    """Whether category int(v) is in the bitset at `start`: negative values (with `truncate`, those
    <= -1) and values from _CAT_LIMIT on are in none."""
    if v >= _CAT_LIMIT or not (v >= 0.0 or (truncate and v > -1.0)):
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
) -> int:
    """out[i] = base + the leaf value of row xt[:, i] in every tree (summed in tree order) for i in
    first..last - 1 (the rule of the module docstring; `floats` is `nodes` seen as float32). Returns
    the number of walks cut off after MAX_DEPTH steps without reaching a leaf (0 for checked arrays:
    a cycle can only come from arrays that skipped check_forest), whose leaf is not added.

    Blocks of _BLOCK rows go through one tree after the other, so that the tree's nodes stay in cache
    while every row of the block reads them; the common step (a numerical node) has no branch."""
    unfinished = 0
    for start in range(first, last, _BLOCK):
        stop = min(last, start + _BLOCK)
        for i in range(start, stop):
            out[i] = base
        for t in range(roots.shape[0]):
            root = roots[t]
            for i in range(start, stop):
                n = root
                budget = MAX_DEPTH  # steps; checked trees are no deeper: a bound, not a cut
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
                        if v < _CAT_LIMIT and (v >= 0.0 or (flags & FLAG_TRUNCATE and v > -1.0)):
                            c = np.int64(v)
                            s = nodes[n, 1]
                            w = c >> 5
                            if w < cat_bits[s] and (cat_bits[s + 1 + w] >> np.uint32(c & 31)) & 1:
                                right = False
                    else:
                        right = v > floats[n, 1]
                    n = nodes[n, 2 + np.int64(right)]
                    budget -= 1
                    if budget == 0:  # tested after the step: the cheapest form of the bound
                        break
                if n < 0:
                    out[i] += leaves[~n]
                else:
                    unfinished += 1
    return unfinished


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
) -> int:
    """_score over `chunks` blocks of _BLOCK rows, the blocks shared out among Numba's threads; returns
    the walks cut off (summed over the blocks)."""
    b = xt.shape[1]
    unfinished = 0
    for c in prange(chunks):
        unfinished += _score(xt, roots, nodes, floats, leaves, cat_bits, base, c * _BLOCK, min(b, (c + 1) * _BLOCK), out)
    return unfinished
