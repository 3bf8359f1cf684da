"""Open Inference Protocol codec: JSON and binary tensors, every input form, and a clear error for every bad request."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.serving.runtime.inference_protocol import (
    HEADER_LENGTH,
    InferOptions,
    RequestError,
    Signature,
    decode_infer_request,
    decode_instances,
    dump_json,
    encode_infer_response,
    parse_json,
)

SIG = Signature(num_dense=2, features=("u", "i"), max_rows=8)


def body(inputs: list[dict[str, object]], **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def dense(b: int = 2) -> dict[str, object]:
    return {"name": "dense", "datatype": "FP32", "shape": [b, 2], "data": list(range(2 * b))}


IDS = [{"name": f, "datatype": "INT64", "shape": [2], "data": [1, 2]} for f in ("u", "i")]


def test_every_input_form_gives_the_same_jagged_ids() -> None:
    one = {"name": "u", "datatype": "INT64", "shape": [2], "data": [5, 6]}
    padded = {"name": "i", "datatype": "INT32", "shape": [2, 3], "data": [[1, -1, 2], [-1, -1, -1]]}
    inputs, options = decode_infer_request(body([dense(), one, padded], id="r1"), None, SIG)
    assert inputs.batch_size == 2 and inputs.dense.dtype == np.float32
    np.testing.assert_array_equal(inputs.ids["u"][0], [5, 6])
    np.testing.assert_array_equal(inputs.ids["u"][1], [1, 1])
    np.testing.assert_array_equal(inputs.ids["i"][0], [1, 2])
    np.testing.assert_array_equal(inputs.ids["i"][1], [2, 0])
    assert options == InferOptions("r1", ("scores", "logits"), frozenset())
    jagged = [
        {"name": "i", "datatype": "INT64", "shape": [3], "data": [7, -3, 9]},  # negative raw keys are fine here
        {"name": "i.lengths", "datatype": "INT32", "shape": [2], "data": [0, 3]},
    ]
    inputs, _ = decode_infer_request(body([dense(), one, *jagged]), None, SIG)
    np.testing.assert_array_equal(inputs.ids["i"][0], [7, -3, 9])
    np.testing.assert_array_equal(inputs.ids["i"][1], [0, 3])


def test_binary_tensors_match_json() -> None:
    d = np.arange(4, dtype=np.float32).reshape(2, 2)
    u = np.array([3, 4], np.int64)
    i = np.array([[1, 2], [3, -1]], np.int64)
    header = {
        "inputs": [
            {"name": "dense", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": d.nbytes}},
            {"name": "u", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": u.nbytes}},
            {"name": "i", "datatype": "INT64", "shape": [2, 2], "parameters": {"binary_data_size": i.nbytes}},
        ],
        "outputs": [{"name": "scores", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    inputs, options = decode_infer_request(head + d.tobytes() + u.tobytes() + i.tobytes(), str(len(head)), SIG)
    np.testing.assert_array_equal(inputs.dense, d)
    np.testing.assert_array_equal(inputs.ids["i"][0], [1, 2, 3])
    assert options.outputs == ("scores",) and options.binary == frozenset({"scores"})
    payload, headers = encode_infer_response("m", "1", options, {"scores": np.array([0.25, 0.5], np.float32)})
    n = int(headers[HEADER_LENGTH])
    meta = json.loads(payload[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(payload[n:], np.float32), [0.25, 0.5])


def test_json_response_roundtrips_float32_exactly() -> None:
    values = np.array([0.1, 1 / 3, 1e-30], np.float32)
    payload, headers = encode_infer_response("m", "2", InferOptions("x", ("scores",), frozenset()), {"scores": values})
    meta = json.loads(payload)
    assert headers["content-type"] == "application/json" and meta["id"] == "x" and meta["model_version"] == "2"
    np.testing.assert_array_equal(np.array(meta["outputs"][0]["data"], np.float32), values)


BAD = [
    (b"not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    (body([]), None, "non-empty list 'inputs'"),
    (body([dense(), {"name": "u", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]), None, "not supported"),
    (body([dense(), {"name": "u", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]), None, "needs integers"),
    (body([dense(), {"name": "u", "datatype": "INT64", "shape": [3], "data": [1, 2]}]), None, "needs 3 values"),
    (
        body([dense(), {"name": "u", "datatype": "INT64", "shape": [2], "data": [[1], [2, 3]]}]),
        None,
        "regular array|needs 2",
    ),
    (body([dense(), {"name": "u", "datatype": "INT64", "shape": [2], "data": [1, 2**70]}]), None, r"field .inputs\[1\]\.data\[1\].: an integer of 22 digits \(1180591620717411303424\)"),
    (body([dense(), {"name": "u", "datatype": "INT64", "shape": [-1], "data": []}]), None, "non-negative"),
    (body([{"name": "dense", "datatype": "FP32", "shape": [2, 3], "data": [0] * 6}, *IDS]), None, r"\[B, 2\]"),
    (body([{**dense(), "data": [float("nan")] * 4}, *IDS]), None, "NaN"),
    (body([{**dense(), "data": [1e39] * 4}, *IDS]), None, "too large"),
    (body([dense()]), None, r"missing inputs \['u', 'i'\]"),
    (
        body([dense(), {"name": "zzz", "datatype": "INT64", "shape": [1], "data": [1]}]),
        None,
        r"unknown inputs \['zzz'\]",
    ),
    (
        body(
            [
                dense(),
                {"name": "u", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},
                {"name": "i", "datatype": "INT64", "shape": [2], "data": [1, 2]},
            ]
        ),
        None,
        "disagree on the batch size",
    ),
    (
        body(
            [
                dense(9),
                {"name": "u", "datatype": "INT64", "shape": [9], "data": [1] * 9},
                {"name": "i", "datatype": "INT64", "shape": [9], "data": [1] * 9},
            ]
        ),
        None,
        "at most 8",
    ),
    (
        body(
            [
                dense(),
                {"name": "u", "datatype": "INT64", "shape": [2], "data": [1, 2]},
                {"name": "i", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},
                {"name": "i.lengths", "datatype": "INT32", "shape": [2], "data": [1, 1]},
            ]
        ),
        None,
        "sums to 2",
    ),
    (
        body(
            [
                dense(),
                {"name": "u", "datatype": "INT64", "shape": [2], "data": [1, 2]},
                {"name": "i", "datatype": "INT64", "shape": [2], "data": [1, 2]},
            ],
            outputs=[{"name": "nope"}],
        ),
        None,
        "unknown output",
    ),
    (
        b'{"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 99}}]}',
        "110",
        "body has",
    ),
    (
        body([{"name": "dense", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}}]),
        "x",
        "must be an integer",
    ),
]


@pytest.mark.parametrize(("payload", "header", "message"), BAD)
def test_bad_requests_name_the_problem(payload: bytes, header: str | None, message: str) -> None:
    with pytest.raises(RequestError, match=message) as info:
        decode_infer_request(payload, header, SIG)
    assert 400 <= info.value.status < 500


def test_binary_sizes_are_checked() -> None:
    head = json.dumps(
        {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 4}}]}
    ).encode()
    with pytest.raises(RequestError, match="8 expected"):
        decode_infer_request(head + b"\0" * 4, str(len(head)), SIG)
    with pytest.raises(RequestError, match="no input claims"):
        decode_infer_request(body([dense(1)]) + b"xx", str(len(body([dense(1)]))), SIG)


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_gives_a_result_or_a_request_error(value: object) -> None:
    for payload in (
        json.dumps({"inputs": [value]}),
        json.dumps(value),
        json.dumps({"inputs": [{**dense(), "data": value}]}),
    ):
        with contextlib.suppress(RequestError):
            decode_infer_request(payload.encode(), None, SIG)


def test_instances() -> None:
    inputs = decode_instances(
        [{"dense": [1, 2], "u": 3, "i": [4, 5]}, {"a": 0.5, "b": 1.5, "u": [], "i": 6}], SIG, ("a", "b")
    )
    np.testing.assert_array_equal(inputs.dense, [[1, 2], [0.5, 1.5]])
    np.testing.assert_array_equal(inputs.ids["u"][1], [1, 0])
    np.testing.assert_array_equal(inputs.ids["i"][0], [4, 5, 6])
    with pytest.raises(RequestError, match="unknown features"):
        decode_instances([{"dense": [1, 2], "u": 3, "i": 4, "x": 1}], SIG)
    with pytest.raises(RequestError, match="missing feature 'i'"):
        decode_instances([{"dense": [1, 2], "u": 3}], SIG)
    with pytest.raises(RequestError, match="integer ids"):
        decode_instances([{"dense": [1, 2], "u": "abc", "i": 4}], SIG)
    with pytest.raises(RequestError, match="non-empty list"):
        decode_instances({"u": 1}, SIG)


def _binary_and_json(tensors: list[tuple[str, str, np.ndarray]]) -> tuple[bytes, str, bytes]:
    """One request as (binary body, header length) and as JSON."""
    specs = [{"name": n, "datatype": t, "shape": list(a.shape)} for n, t, a in tensors]
    head = json.dumps(
        {
            "inputs": [
                {**s, "parameters": {"binary_data_size": a.nbytes}} for s, (_, _, a) in zip(specs, tensors, strict=True)
            ]
        }
    ).encode()
    as_json = body([{**s, "data": a.ravel().tolist()} for s, (_, _, a) in zip(specs, tensors, strict=True)])
    return head + b"".join(a.tobytes() for _, _, a in tensors), str(len(head)), as_json


def _decoded(payload: bytes, header: str | None) -> tuple[str, object]:
    try:
        inputs, _ = decode_infer_request(payload, header, SIG)
    except RequestError as e:
        return "error", str(e).split(":")[0]
    return "ok", (inputs.dense.tolist(), {f: (v.tolist(), n.tolist()) for f, (v, n) in inputs.ids.items()})


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    forms=st.lists(st.sampled_from(["one", "one32", "lengths", "padded"]), min_size=2, max_size=2),
    order=st.permutations(["dense", "u", "i"]),
    bad_dense=st.booleans(),
    negative=st.booleans(),
)
def test_binary_requests_decode_as_their_json_twin_also_when_the_header_is_cached(
    b: int, forms: list[str], order: list[str], bad_dense: bool, negative: bool
) -> None:
    rng = np.random.default_rng(b)
    d = rng.standard_normal((b, 2)).astype(np.float32)
    if bad_dense:
        d[0, 0] = np.nan
    tensors: dict[str, list[tuple[str, str, np.ndarray]]] = {"dense": [("dense", "FP32", d)]}
    for f, form in zip(("u", "i"), forms, strict=True):
        ids = rng.integers(-1 if negative else 0, 9, b)
        match form:
            case "one":
                tensors[f] = [(f, "INT64", ids.astype(np.int64))]
            case "one32":
                tensors[f] = [(f, "INT32", ids.astype(np.int32))]
            case "lengths":
                lengths = rng.integers(0, 3, b).astype(np.int32)
                tensors[f] = [
                    (f, "INT64", rng.integers(0, 9, int(lengths.sum())).astype(np.int64)),
                    (f + ".lengths", "INT32", lengths),
                ]
            case _:
                tensors[f] = [(f, "INT64", np.where(rng.random((b, 2)) < 0.3, -1, rng.integers(0, 9, (b, 2))))]
    request = [t for name in order for t in tensors[name]]
    binary, header, as_json = _binary_and_json(request)
    want = _decoded(as_json, None)
    assert _decoded(binary, header) == want
    assert _decoded(binary, header) == want  # now from the cached layout
    assert _decoded(binary + b"\0", header)[0] == "error"  # a blob longer than the header says
    assert _decoded(binary[:-1], header)[0] == "error"


@pytest.mark.parametrize("shape", [[2**26, 0], [2**40, 0], [0, 2**40], [2**62, 0, 2**62]])
@pytest.mark.parametrize("binary", [False, True])
def test_huge_declared_shapes_of_empty_tensors_are_refused_before_allocating(shape: list[int], binary: bool) -> None:
    """#20 defect 2: a zero in the shape made [2^26, 0] cost 443 MB and [2^40, 0] a MemoryError (500)."""
    import tracemalloc

    spec: dict[str, object] = {"name": "u", "datatype": "INT64", "shape": shape}
    if binary:
        spec["parameters"] = {"binary_data_size": 0}
        raw = json.dumps({"inputs": [dense(), spec, IDS[1]]}).encode()
        header_length: str | None = str(len(raw))
        raw += b"\0"  # one byte so that the binary path is taken; no input claims it
    else:
        spec["data"] = []
        raw, header_length = body([dense(), spec, IDS[1]]), None
    tracemalloc.start()
    try:
        with pytest.raises(RequestError, match="has a dimension above") as e:
            decode_infer_request(raw, header_length, SIG)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.status == 400 and peak < 1 << 20


def test_a_wide_jagged_tensor_within_its_values_is_accepted() -> None:
    """The shape bound is max(max_rows, values): [N] ids with lengths may hold more ids than max_rows."""
    n = 3 * SIG.max_rows
    jagged = [
        {"name": "i", "datatype": "INT64", "shape": [n], "data": list(range(n))},
        {"name": "i.lengths", "datatype": "INT32", "shape": [2], "data": [1, n - 1]},
    ]
    inputs, _ = decode_infer_request(body([dense(), IDS[0], *jagged]), None, SIG)
    np.testing.assert_array_equal(inputs.ids["i"][1], [1, n - 1])


def test_deeply_nested_json_is_a_400_not_a_recursion_error() -> None:
    """#20 defect 3: orjson refuses it, the fallback parser raised RecursionError (500)."""
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(RequestError, match=r"not valid JSON.*nested too deeply") as e:
        decode_infer_request(deep, None, SIG)
    assert e.value.status == 400


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        ("1" + "2" * 29, "1" + "2" * 29),  # 30 digits: orjson would read it as a float (1.22e29)
        ("18446744073709551616", "18446744073709551616"),  # 2**64, 20 digits
        ("-9223372036854775809", "-9223372036854775809"),  # -2**63 - 1
        ("9" * 400, "9" * 40 + "..."),  # truncated in the answer
    ],
)
def test_an_integer_beyond_64_bits_is_a_400_naming_the_field_and_the_value(literal: str, shown: str) -> None:
    raw = f'{{"instances": [{{"C1": [3, {literal}]}}]}}'.encode()
    digits = len(literal.lstrip("-"))
    with pytest.raises(RequestError, match=rf"field 'instances\[0\]\.C1\[1\]': an integer of {digits} digits \({shown}\)"):
        parse_json(raw)


def test_long_digit_runs_that_are_not_big_integers_parse_as_before() -> None:
    """A run of 20 digits sends the body to the standard parser; strings, fractions and 64-bit integers keep
    their values (the same as orjson's)."""
    raw = b'{"s": "123456789012345678901234", "f": 1.00000000000000000000001, "u": 18446744073709551615, "i": -9223372036854775808}'
    assert parse_json(raw) == json.loads(raw)
    assert parse_json(raw)["u"] == 2**64 - 1


def test_fractions_with_long_digit_runs_stay_on_the_fast_parser() -> None:
    """A float's fraction or exponent is no integer literal: -0.0058760265819728374 (19 digits after the point,
    common in JSON tensors) and 1e-00000000000000000005 keep orjson; 19-digit ids within int64 too."""
    from hugerec.serving.runtime.inference_protocol import _may_hold_big_integers

    floats = b'{"data": [-0.0058760265819728374, 0.00026772439014166594, 1e-00000000000000000005, 9223372036854775807]}'
    assert not _may_hold_big_integers(floats)
    assert parse_json(floats) == json.loads(floats)
    for big in (b"[1, 18446744073709551616]", b"[-9223372036854775809]", b"18446744073709551616", b'{"a":12345678901234567890}'):
        assert _may_hold_big_integers(big), big


def test_dump_json_is_compact_and_refuses_what_json_cannot_hold() -> None:
    value = {"items": [3, 1], "scores": [0.5, 1e-3], "notes": ["null is a word"], "ok": True, "none": None}
    assert dump_json(value) == json.dumps(value, separators=(",", ":")).encode()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN or infinite"):
            dump_json({"scores": [0.5, bad], "x": None})
