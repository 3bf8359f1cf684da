"""The checks every tree passes before it is flattened: each finding of issue 28 (truncated LightGBM text,
tree_sizes mismatch, garbage, a child pointing at its own node, XGBoost's out-of-range child, base_score 1,
category 2**40) is a one-line refusal naming the file, tree and node; mutated node arrays are refused or
scored finitely; the kernel stops on a cycle even in arrays that skipped the checks."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hugerec.serving.runtime.forest import _BLOCK, FLAG_CATEGORICAL, Forest, _score, _score_parallel, margin_reference
from hugerec.serving.runtime.forest_check import MAX_DEPTH, ModelFileError, check_forest

lightgbm = pytest.importorskip("lightgbm")
xgboost = pytest.importorskip("xgboost")

WHERE = "bundle/model.txt"


def _data(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.normal(size=n), rng.normal(size=n), rng.integers(0, 12, size=n)]).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    y = ((np.nan_to_num(x[:, 0]) + (np.nan_to_num(x[:, 2]) % 3 == 0)) > 0.4).astype(np.float32)
    return x, y


@pytest.fixture(scope="module")
def lgb_text() -> str:
    x, y = _data()
    params = {"objective": "binary", "num_leaves": 6, "verbose": -1, "min_data_per_group": 5, "cat_smooth": 1.0,
              "max_cat_to_onehot": 4, "num_threads": 1}  # fmt: skip
    booster = lightgbm.train(params, lightgbm.Dataset(x, y, categorical_feature=[2]), num_boost_round=8)
    return str(booster.model_to_string())


@pytest.fixture(scope="module")
def xgb_model() -> dict[str, Any]:
    x, y = _data()
    d = xgboost.DMatrix(x, y, feature_types=["q", "q", "c"], enable_categorical=True)
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1, "max_cat_to_onehot": 1}
    booster = xgboost.train(params, d, num_boost_round=6)
    model: dict[str, Any] = json.loads(bytes(booster.save_raw("json")))
    return model


def _rows(n: int = 300, seed: int = 1) -> np.ndarray:
    x, _ = _data(n, seed)
    x[:10, 2] = [-0.5, -0.99, -1.0, 0.5, 2.7, 1e6, 2**31, 3e9, -3.0, 11.0]
    return x


def _refused(make: Any, *needles: str) -> str:
    """The one-line ModelFileError of make(), containing each needle."""
    with pytest.raises(ModelFileError) as caught:
        make()
    message = str(caught.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


# -- LightGBM text edits --------------------------------------------------------------------------------
def _without_tree_sizes(text: str) -> str:
    return re.sub(r"^tree_sizes=.*\n", "", text, flags=re.M)


def _set(text: str, tree: int, key: str, index: int, value: object) -> str:
    """`key=` of Tree=tree with its index-th value replaced (tree_sizes dropped: the block's size changes)."""
    lines = _without_tree_sizes(text).split("\n")
    start = lines.index(f"Tree={tree}")
    at = next(i for i in range(start, len(lines)) if lines[i].startswith(f"{key}="))
    values = lines[at].partition("=")[2].split()
    values[index] = str(value)
    lines[at] = f"{key}={' '.join(values)}"
    return "\n".join(lines)


def _get(text: str, tree: int, key: str) -> list[str]:
    lines = text.split("\n")
    start = lines.index(f"Tree={tree}")
    return next(line for line in lines[start:] if line.startswith(f"{key}=")).partition("=")[2].split()


def test_valid_models_pass_and_equal_the_library(lgb_text: str, xgb_model: dict[str, Any]) -> None:
    x = _rows()
    forest = Forest.from_lightgbm(lgb_text, WHERE)
    assert (forest.flags & FLAG_CATEGORICAL).any()
    booster = lightgbm.Booster(model_str=lgb_text)
    np.testing.assert_array_equal(forest.margin(x), booster.predict(x, raw_score=True))  # -0.5 is category 0 there too
    np.testing.assert_array_equal(forest.margin(x), margin_reference(forest, x))
    forest = Forest.from_xgboost(xgb_model, "model.json")
    assert (forest.flags & FLAG_CATEGORICAL).any()
    booster = xgboost.Booster(model_file=bytearray(json.dumps(xgb_model).encode()))
    np.testing.assert_allclose(forest.margin(x), booster.inplace_predict(x, predict_type="margin"), rtol=1e-5, atol=1e-5)
    assert not forest.nodes.flags.writeable and not forest.leaves.flags.writeable  # checked, then frozen


def test_truncated_lightgbm_text_is_refused(lgb_text: str) -> None:
    end = lgb_text.index("end of trees")  # what follows (parameters, feature importances) is not read
    for cut in (5, 60, end // 3, end // 2, end - 3, end + 5):
        _refused(lambda cut=cut: Forest.from_lightgbm(lgb_text[:cut], WHERE), WHERE)
    message = _refused(lambda: Forest.from_lightgbm(lgb_text[: len(lgb_text) // 2], WHERE))
    assert "truncated" in message or "tree" in message


def test_tree_sizes_mismatch_is_refused(lgb_text: str) -> None:
    sizes = re.search(r"tree_sizes=(.*)", lgb_text)
    assert sizes is not None
    values = sizes.group(1).split()
    values[3] = str(int(values[3]) + 7)
    bad = lgb_text.replace(sizes.group(0), "tree_sizes=" + " ".join(values))
    _refused(lambda: Forest.from_lightgbm(bad, WHERE), WHERE, "tree 3", "tree_sizes")
    fewer = lgb_text.replace(sizes.group(0), "tree_sizes=" + " ".join(values[:-1]))
    _refused(lambda: Forest.from_lightgbm(fewer, WHERE), "tree_sizes= lists 7 trees, the file holds 8")


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "hello",
        "tree\n" + "x" * 100_000,
        "tree\nversion=v4\nmax_feature_idx=2\n\nTree=0\n" + "x" * 100_000,
        "tree\nmax_feature_idx=99999999999\n\nTree=0\nnum_leaves=1\nleaf_value=0\n\nend of trees\n",
        "tree\nmax_feature_idx=2\n\nTree=0\nnum_leaves=3\nleaf_value=1 2 3\n\nend of trees\n",
        "tree\nmax_feature_idx=2\n\nTree=7\nnum_leaves=1\nleaf_value=1\n\nend of trees\n",
        "tree\nmax_feature_idx=2\n\nTree=0\nnum_leaves=1\nleaf_value=" + "9" * 5000 + "\n\nend of trees\n",
        "tree\nmax_feature_idx=2\n\nTree=0\nnum_leaves=-4\nleaf_value=1\n\nend of trees\n",
    ],
)
def test_lightgbm_garbage_is_refused(garbage: str) -> None:
    _refused(lambda: Forest.from_lightgbm(garbage, WHERE), WHERE)


def test_lightgbm_child_pointing_at_its_own_node_is_refused(lgb_text: str) -> None:
    for key, side in (("left_child", "left"), ("right_child", "right")):
        bad = _set(lgb_text, 2, key, 1, 1)
        _refused(lambda bad=bad: Forest.from_lightgbm(bad, WHERE), WHERE, "tree 2 node 1", f"{side} child is the node itself")


def test_lightgbm_cycles_shared_subtrees_and_out_of_range_children_are_refused(lgb_text: str) -> None:
    n = len(_get(lgb_text, 1, "left_child"))
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "left_child", n - 1, 0), WHERE), "tree 1", "cycle")
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "right_child", 0, n), WHERE), "tree 1 node 0", "out of range")
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "right_child", 0, -n - 2), WHERE), "out of range")
    leaf = _get(lgb_text, 1, "left_child")[0]
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "right_child", 0, leaf), WHERE), "tree 1 node 0")
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "split_feature", 0, 3), WHERE), "feature 3", "0..2")
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "leaf_value", 0, "inf"), WHERE), "tree 1 leaf 0", "not finite")
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "decision_type", 0, 12), WHERE), "decision_type 12")
    numerical = next(k for k, d in enumerate(_get(lgb_text, 1, "decision_type")) if not int(d) & 1)
    _refused(lambda: Forest.from_lightgbm(_set(lgb_text, 1, "threshold", numerical, "nan"), WHERE), "threshold is NaN")


def _chain(depth: int) -> str:
    """A LightGBM text model of one tree: `depth` inner nodes in a chain (x0 <= 0 goes on), leaves
    0..depth-1 on the right, leaf `depth` at the bottom."""
    n = depth
    tree = {
        "num_leaves": n + 1,
        "split_feature": " ".join(["0"] * n),
        "threshold": " ".join(["0"] * n),
        "decision_type": " ".join(["2"] * n),
        "left_child": " ".join([*(str(k + 1) for k in range(n - 1)), str(~n)]),
        "right_child": " ".join(str(~k) for k in range(n)),
        "leaf_value": " ".join(str(float(k)) for k in range(n + 1)),
    }
    body = "\n".join(f"{k}={v}" for k, v in tree.items())
    return f"tree\nversion=v4\nnum_class=1\nmax_feature_idx=0\nobjective=regression\n\nTree=0\n{body}\n\nend of trees\n"


def test_depth_is_bounded_and_the_bound_is_not_a_cut() -> None:
    _refused(lambda: Forest.from_lightgbm(_chain(MAX_DEPTH + 1), WHERE), f"deeper than {MAX_DEPTH}")
    forest = Forest.from_lightgbm(_chain(MAX_DEPTH), WHERE)  # the deepest tree served
    x = np.array([[-1.0], [1.0], [np.nan]], np.float32)
    np.testing.assert_array_equal(forest.margin(x), [MAX_DEPTH, 0.0, MAX_DEPTH])  # all the way down: the last leaf
    np.testing.assert_array_equal(margin_reference(forest, x), forest.margin(x))


# -- XGBoost --------------------------------------------------------------------------------------------
def _tree(model: dict[str, Any], t: int) -> dict[str, Any]:
    tree: dict[str, Any] = model["learner"]["gradient_booster"]["model"]["trees"][t]
    return tree


def _edited(model: dict[str, Any], edit: Any) -> dict[str, Any]:
    out = copy.deepcopy(model)
    edit(out)
    return out


def test_xgboost_findings_are_refused(xgb_model: dict[str, Any]) -> None:
    inner = next(k for k, c in enumerate(_tree(xgb_model, 1)["left_children"]) if c != -1 and k > 0)

    def self_loop(m: dict[str, Any]) -> None:
        _tree(m, 1)["left_children"][inner] = inner

    def out_of_range(m: dict[str, Any]) -> None:
        _tree(m, 1)["right_children"][0] = 10_000

    def base_score(v: str) -> Any:
        return lambda m: m["learner"]["learner_model_param"].__setitem__("base_score", v)

    _refused(lambda: Forest.from_xgboost(_edited(xgb_model, self_loop), "model.json"), "model.json: tree 1", f"node {inner}",
             "the node itself")  # fmt: skip
    _refused(lambda: Forest.from_xgboost(_edited(xgb_model, out_of_range), "model.json"), "tree 1 node 0", "out of range")
    for v in ("[1E0]", "1", "0", "[-2E-1]", "nan", "inf", "abc"):
        _refused(lambda v=v: Forest.from_xgboost(_edited(xgb_model, base_score(v)), "model.json"), "model.json", "base_score")
    cat = next(t for t in range(6) if _tree(xgb_model, t)["categories"])

    def huge_category(m: dict[str, Any]) -> None:
        _tree(m, cat)["categories"][0] = 2**40

    _refused(lambda: Forest.from_xgboost(_edited(xgb_model, huge_category), "model.json"), f"tree {cat}", str(2**40))


def test_xgboost_other_damage_is_refused(xgb_model: dict[str, Any]) -> None:
    def set_(t: int, key: str, k: int, v: object) -> Any:
        return lambda m: _tree(m, t)[key].__setitem__(k, v)

    def objective(name: str) -> Any:
        return lambda m: m["learner"]["objective"].__setitem__("name", name)

    cases = [
        (set_(0, "split_indices", 0, 7), "feature 7"),
        (set_(0, "split_conditions", 0, float("nan")), "threshold is NaN"),
        (set_(0, "left_children", 0, "1"), "not an integer"),
        (set_(0, "default_left", 0, 5), "default_left 5"),
        (set_(0, "split_type", 0, 4), "split_type 4"),
        (lambda m: _tree(m, 0).__setitem__("left_children", _tree(m, 0)["left_children"][:-1]), "children must be a list of"),
        (objective("multi:softprob"), "objective"),
        (lambda m: m["learner"]["gradient_booster"]["model"].__setitem__("trees", {}), "trees"),
        (lambda m: m["learner"].pop("objective"), "not an XGBoost JSON model"),
    ]
    leaf = next(k for k, c in enumerate(_tree(xgb_model, 0)["left_children"]) if c == -1)
    cases.append((set_(0, "split_conditions", leaf, float("inf")), f"node {leaf}: leaf value inf"))
    for edit, needle in cases:
        _refused(lambda edit=edit: Forest.from_xgboost(_edited(xgb_model, edit), "model.json"), "model.json", needle)
    for text in ("", "[" * 100_000 + "]" * 100_000, '{"learner": 1e400}', "[1, 2]", '{"a": ' + "9" * 5000 + "}"):
        _refused(lambda text=text: Forest.from_xgboost_json(text, "model.json"), "model.json")


@pytest.mark.filterwarnings("ignore:.*You have manually specified the `updater`")
def test_xgboost_log_link_objectives_and_pruned_nodes() -> None:
    """base_score through each objective's link, and the nodes XGBoost keeps after pruning (num_deleted)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 4)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=800) > 0).astype(np.float32)
    d = xgboost.DMatrix(x, y + 0.5)
    booster = xgboost.train({"objective": "count:poisson", "max_depth": 3, "base_score": 0.3, "nthread": 1}, d, 3)
    forest = Forest.from_xgboost_json(bytes(booster.save_raw("json")))
    np.testing.assert_allclose(forest.margin(x), booster.inplace_predict(x, predict_type="margin"), rtol=1e-5, atol=1e-5)
    d = xgboost.DMatrix(x, y)
    params = {"objective": "binary:logistic", "max_depth": 6, "nthread": 1}
    booster = xgboost.train(params, d, 4)
    pruned = xgboost.train({**params, "process_type": "update", "updater": "prune", "gamma": 50}, d, 4, xgb_model=booster)
    model = json.loads(bytes(pruned.save_raw("json")))
    assert int(_tree(model, 0)["tree_param"]["num_deleted"]) > 0
    forest = Forest.from_xgboost(model)
    np.testing.assert_allclose(forest.margin(x), pruned.inplace_predict(x, predict_type="margin"), rtol=1e-5, atol=1e-5)
    _tree(model, 0)["tree_param"]["num_deleted"] = "0"  # the same nodes unreached, none said to be pruned
    _refused(lambda: Forest.from_xgboost(model, "model.json"), "tree 0", "not reached from the root")


# -- the flat arrays and the kernel ---------------------------------------------------------------------
def _rebuilt(forest: Forest, **arrays: np.ndarray) -> Forest:
    fields = {k: getattr(forest, k) for k in ("library", "roots", "nodes", "leaves", "cat_bits", "base", "num_features")}
    return Forest(**{**fields, **{k: v.copy() for k, v in fields.items() if isinstance(v, np.ndarray)}, **arrays})


def test_check_forest_refuses_bad_flat_arrays(lgb_text: str) -> None:
    forest = Forest.from_lightgbm(lgb_text, WHERE)
    check_forest(forest)
    categorical = int(np.flatnonzero(forest.flags & FLAG_CATEGORICAL)[0])

    def nodes_with(k: int, column: int, value: int) -> np.ndarray:
        nodes = forest.nodes.copy()
        nodes[k, column] = value
        return nodes

    m, n_leaves = forest.nodes.shape[0], forest.leaves.shape[0]
    root = int(forest.roots[1])
    leaves = forest.leaves.copy()
    leaves[3] = np.inf
    cases = {
        "self loop": {"nodes": nodes_with(root, 2, root)},
        "back to a root": {"nodes": nodes_with(root + 1, 3, root)},
        "child beyond": {"nodes": nodes_with(root, 2, m)},
        "leaf beyond": {"nodes": nodes_with(root, 3, ~n_leaves)},
        "feature beyond": {"nodes": nodes_with(root, 0, (int(forest.nodes[root, 0]) & ~0xFFFFFF) | 3)},
        "bitset beyond": {"nodes": nodes_with(categorical, 1, forest.cat_bits.shape[0])},
        "leaf inf": {"leaves": leaves},
        "root beyond": {"roots": np.r_[forest.roots[:-1], m].astype(np.int32)},
    }
    for name, arrays in cases.items():
        with pytest.raises(ModelFileError) as caught:
            _rebuilt(forest, **arrays)
        assert "\n" not in str(caught.value), name


def _unchecked(forest: Forest, nodes: np.ndarray) -> Forest:
    """A Forest around `nodes` that skipped check_forest (as arrays changed behind its back would be)."""
    out = object.__new__(Forest)
    for k in ("library", "roots", "leaves", "cat_bits", "base", "num_features", "source"):
        object.__setattr__(out, k, getattr(forest, k))
    object.__setattr__(out, "nodes", nodes)
    return out


def test_the_kernel_stops_on_a_cycle_that_skipped_the_checks(lgb_text: str) -> None:
    forest = Forest.from_lightgbm(lgb_text, WHERE)
    nodes = forest.nodes.copy()
    root = int(forest.roots[2])
    nodes[root, 2] = nodes[root, 3] = root  # every row loops at tree 2's root
    bad = _unchecked(forest, nodes)
    x = _rows(200)
    xt = np.ascontiguousarray(x.T)
    out = np.empty(200)
    assert _score(xt, *bad._arrays(), bad.base, 0, 200, out) == 200  # one cut-off walk per row, and it returned
    assert _score_parallel(xt, *bad._arrays(), bad.base, -(-200 // _BLOCK), out) == 200
    with pytest.raises(RuntimeError, match="did not reach a leaf"):
        bad.margin(x)
    with pytest.raises(RuntimeError, match="MAX_DEPTH"):
        margin_reference(bad, x)


# -- mutations ------------------------------------------------------------------------------------------
def _refused_or_finite(make: Any, x: np.ndarray) -> None:
    """make() is refused in one line, or its forest scores x finitely, as its reference does."""
    try:
        forest = make()
    except ModelFileError as e:
        assert "\n" not in str(e)
        return
    got = forest.margin(x)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, margin_reference(forest, x))


VALUES = st.one_of(
    st.integers(-70, 70),
    st.sampled_from([2**31 - 1, -(2**31), 2**40, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_lightgbm_trees_are_refused_or_scored_finitely(lgb_text: str, data: st.DataObject) -> None:
    text = lgb_text
    for _ in range(data.draw(st.integers(1, 3))):
        t = data.draw(st.integers(0, 7))
        key = data.draw(st.sampled_from(["left_child", "right_child", "split_feature", "threshold", "decision_type"]))
        k = data.draw(st.integers(0, len(_get(text, t, key)) - 1))
        text = _set(text, t, key, k, data.draw(VALUES))
    _refused_or_finite(lambda: Forest.from_lightgbm(text, WHERE), _rows(64, 5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_xgboost_trees_are_refused_or_scored_finitely(xgb_model: dict[str, Any], data: st.DataObject) -> None:
    model = copy.deepcopy(xgb_model)
    for _ in range(data.draw(st.integers(1, 3))):
        tree = _tree(model, data.draw(st.integers(0, 5)))
        key = data.draw(st.sampled_from(["left_children", "right_children", "split_indices", "split_conditions", "categories"]))
        if not tree[key]:
            continue
        k = data.draw(st.integers(0, len(tree[key]) - 1))
        value = data.draw(VALUES)
        tree[key][k] = value if key == "split_conditions" or not isinstance(value, float) else int(value) if math.isfinite(value) else 0
    _refused_or_finite(lambda: Forest.from_xgboost(model, "model.json"), _rows(64, 6))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_flat_arrays_are_refused_or_scored_and_the_kernel_always_returns(lgb_text: str, data: st.DataObject) -> None:
    forest = Forest.from_lightgbm(lgb_text, WHERE)
    m, n_leaves = forest.nodes.shape[0], forest.leaves.shape[0]
    nodes = forest.nodes.copy()
    for _ in range(data.draw(st.integers(1, 4))):
        k = data.draw(st.integers(0, m - 1))
        match data.draw(st.sampled_from(["child", "feature", "threshold"])):
            case "child":  # in range, so the unchecked kernel below reads no memory it does not own
                nodes[k, data.draw(st.sampled_from([2, 3]))] = data.draw(st.integers(-n_leaves, m - 1))
            case "feature":
                nodes[k, 0] = (int(nodes[k, 0]) & ~0xFFFFFF) | data.draw(st.integers(0, 2))
            case _:
                if not forest.flags[k] & FLAG_CATEGORICAL:
                    nodes[k, 1:2].view(np.float32)[0] = np.float32(data.draw(st.floats(width=32)))
    x = _rows(64, 7)
    _refused_or_finite(lambda: _rebuilt(forest, nodes=nodes), x)
    bad = _unchecked(forest, nodes)  # the same arrays, unchecked: the kernel returns, cycles or not
    out = np.empty(64)
    cut = _score(np.ascontiguousarray(x.T), *bad._arrays(), bad.base, 0, 64, out)
    assert 0 <= cut <= 64 * forest.num_trees
