"""The Open Inference Protocol v2 (KServe / Triton) as hugerec models speak it: decode, validate, encode.

Inputs of a model with Dd dense features and sparse features f1..fF, B examples per request:

    "dense"        FP32 (any int/float type) [B, Dd]    omitted when Dd = 0
    "<f>"          INT64 (any int type)   [B]          one id per example
                                          [B, L]       L ids per example, -1 marks an empty slot
                                          [N]          with "<f>.lengths" [B]: example b has lengths[b] ids
Outputs: "scores" FP32 [B] (sigmoid of the logits) and "logits" FP32 [B].

Tensors come as JSON ("data", row-major, flat or nested) or with the binary extension: the JSON
header is followed by raw little-endian bytes ("binary_data_size" per tensor, the header's length
in the Inference-Header-Content-Length HTTP header). Any problem with a request raises
`RequestError` with a message naming the tensor and what is wrong; the server answers 4xx with it.
Inputs that only another loaded version of the same model takes are ignored (LiveFields).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hugerec.serving.runtime.model_inputs import ModelInputs

try:
    import orjson as _orjson
except ImportError:  # optional: the standard parser does the same, slower
    _orjson = None  # type: ignore[assignment]

HEADER_LENGTH = "Inference-Header-Content-Length"
OUTPUTS = ("scores", "logits")
LENGTHS_SUFFIX = ".lengths"
PADDING = -1

_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_INT_TYPES = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
_NUMBER_TYPES = _INT_TYPES | {"FP16", "FP32", "FP64"}


class RequestError(ValueError):
    """A bad request: `status` is the HTTP status to answer (400, 404, 413, ...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Signature:
    """What a model takes: Dd dense features and the sparse feature names; `max_rows` per request."""

    num_dense: int
    features: tuple[str, ...]
    max_rows: int = 65536
    vectors: tuple[tuple[str, int], ...] = ()  # (name, dim): optional inline inputs `vector.<name>` FP32 [B, dim]
    missing_values: bool = False  # NaN dense values are missing values (tree models), not refused
    max_ids: int | None = None  # at most this many ids per example and feature (tree models: 1)

    def inputs_metadata(self) -> list[dict[str, Any]]:
        meta = [{"name": "dense", "datatype": "FP32", "shape": [-1, self.num_dense]}] if self.num_dense else []
        meta += [{"name": f, "datatype": "INT64", "shape": [-1, -1]} for f in self.features]
        return meta + [
            {"name": VECTOR_PREFIX + name, "datatype": "FP32", "shape": [-1, dim], "optional": True}
            for name, dim in self.vectors
        ]

    @staticmethod
    def outputs_metadata() -> list[dict[str, Any]]:
        return [{"name": name, "datatype": "FP32", "shape": [-1]} for name in OUTPUTS]

    def input_names(self) -> frozenset[str]:
        """The infer input names this signature takes ("dense" always: a [B, 0] one is accepted)."""
        lengths = {f + LENGTHS_SUFFIX for f in self.features}
        return frozenset({"dense", *self.features, *lengths, *(VECTOR_PREFIX + name for name, _ in self.vectors)})


@dataclass(frozen=True)
class LiveFields:
    """The request fields the loaded versions of one model take, together (versions.ModelVersions keeps one per
    model name, computed again only when a version is loaded or unloaded).

    The version answering a request ignores a field it does not take itself when another loaded version of
    the model takes it: while a stable and a canary trained on different schemas share the traffic, clients
    send the fields of both and each version reads its own. A field no loaded version takes is refused (a
    typo is never dropped silently), and a field the answering version needs stays required.

        inputs  infer input names ("dense", "<f>", "<f>.lengths", "vector.<name>")
        keys    /predict instance keys (sparse features, dense columns by name, "dense", raw workflow columns)
        dense   the number of dense values each version takes (a positional "dense" fits one width only)
        versions  how many versions are loaded (error messages say "no loaded version" when several are)

    The default (nothing) is a model with one version: every field it does not take is refused.
    """

    inputs: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    dense: frozenset[int] = frozenset()
    versions: int = 1


ONE_VERSION = LiveFields()  # the default of the decoders: a model with one version


@dataclass(frozen=True)
class InferOptions:
    """What the client asked back: request id, output names, and which of them as binary."""

    request_id: str | None
    outputs: tuple[str, ...]
    binary: frozenset[str]


def parse_tensors(header_bytes: bytes, blob: bytes, max_rows: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A request's JSON header and binary part -> (the request object, its input tensors by name).

    Every input is decoded (JSON data or its share of the binary part, at most `max_rows` rows);
    a name given twice or binary bytes no input claims are RequestErrors."""
    try:
        request = parse_json(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(request, dict):
        raise RequestError(f"request must be a JSON object, got {type(request).__name__}")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("request needs a non-empty list 'inputs'")
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for i, spec in enumerate(inputs):
        name, array, offset = decode_tensor(spec, i, blob, offset, max_rows)
        if name in tensors:
            raise RequestError(f"input {name!r} is given twice")
        tensors[name] = array
    if offset != len(blob):
        raise RequestError(f"request has {len(blob) - offset} bytes of binary data that no input claims")
    return request, tensors


def decode_infer_request(
    body: bytes, header_length: str | None, signature: Signature, live: LiveFields = ONE_VERSION
) -> tuple[ModelInputs, InferOptions]:
    """An infer request body (JSON, or JSON header + binary tensors) -> validated ModelInputs; inputs only other
    loaded versions of the model take (`live`) are ignored."""
    header_bytes, blob = split_body(body, header_length)
    if blob and len(header_bytes) <= MAX_CACHED_HEADER:
        layout = _binary_layout(header_bytes, signature)
        if layout is not None and layout.end == len(blob):
            return layout.decode(blob, signature, live), layout.options
    request, tensors = parse_tensors(header_bytes, blob, signature.max_rows)
    return to_model_inputs(tensors, signature, live), _options(request)


@dataclass(frozen=True, eq=False)
class _BinaryLayout:
    """Where each input of an all-binary request lies in the binary part, validated once per header.

    Clients send the same header for every request of one shape (tritonclient does), so the JSON
    parse and the checks of names, types and shapes run once; a request then only slices its bytes.
    one_id: every sparse feature is one INT64 id per example and the dense input (if any) is FP32
    [B, Dd], so the slices are the model inputs as they are (only the dense values need a check).
    """

    names: tuple[str, ...]
    dtypes: tuple[np.dtype[Any], ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    end: int
    options: InferOptions
    one_id: bool
    ids_block: tuple[tuple[str, ...], int] | None  # one_id features (names, offset of the first) when back to back

    def decode(self, blob: bytes, signature: Signature, live: LiveFields = ONE_VERSION) -> ModelInputs:
        if not self.one_id:
            arrays = [
                np.frombuffer(blob, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
                for dtype, shape, offset in zip(self.dtypes, self.shapes, self.offsets, strict=True)
            ]
            return to_model_inputs(dict(zip(self.names, arrays, strict=True)), signature, live)
        b = self.shapes[0][0]
        dense: np.ndarray = np.zeros((b, 0), np.float32)
        if "dense" in self.names:
            at = self.names.index("dense")
            # np.array: a writable copy (the slice is a read-only view of the body)
            dense = np.array(np.frombuffer(blob, np.float32, b * signature.num_dense, self.offsets[at]))
            dense = dense.reshape(b, signature.num_dense)
            _check_dense(dense, signature)
        if self.ids_block is not None:  # the ids of all features lie back to back: one slice, a row each
            features, start = self.ids_block
            block = np.frombuffer(blob, np.int64, len(features) * b, start).reshape(-1, b)  # [F, B]
            return ModelInputs.from_one_id(dense, features, block)
        ones = _ones(b)
        ids = {
            name: (np.frombuffer(blob, np.int64, b, offset), ones)
            for name, offset in zip(self.names, self.offsets, strict=True)
            if name != "dense"
        }
        return ModelInputs(dense, ids)


MAX_CACHED_HEADER = 16384  # bytes; bigger headers are parsed every time (and never kept)


@functools.lru_cache(maxsize=256)
def _binary_layout(header: bytes, signature: Signature) -> _BinaryLayout | None:
    """The layout of an all-binary request header, or None (some input has JSON data, or the header is
    bad: the uncached path then decodes or reports it)."""
    try:
        request = parse_json(header)
        inputs = request.get("inputs") if isinstance(request, dict) else None
        if not isinstance(inputs, list) or not inputs:
            return None
        options = _options(request)
        specs = [_tensor_spec(spec, i, signature.max_rows) for i, spec in enumerate(inputs)]
    except (json.JSONDecodeError, UnicodeDecodeError, RequestError):
        return None
    names = tuple(spec[0] for spec in specs)
    if len(set(names)) != len(names):
        return None
    dtypes, shapes, offsets, offset = [], [], [], 0
    for _, shape, count, datatype, size in specs:
        dtype = _DTYPES[datatype]
        if size is None or size != count * dtype.itemsize:
            return None
        dtypes.append(dtype)
        shapes.append(tuple(shape))
        offsets.append(offset)
        offset += size
    b = shapes[0][0] if shapes[0] else -1
    one_id = (
        set(names) == set(signature.features) | ({"dense"} if signature.num_dense else set())
        and 0 < b <= signature.max_rows
        and all(
            (dtype == np.float32 and shape == (b, signature.num_dense))
            if name == "dense"
            else (dtype == np.int64 and shape == (b,))
            for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
        )
    )
    features = tuple((name, at) for name, at in zip(names, offsets, strict=True) if name != "dense")
    back_to_back = all(y[1] - x[1] == 8 * b for x, y in itertools.pairwise(features))
    block = (tuple(name for name, _ in features), features[0][1]) if one_id and back_to_back and features else None
    return _BinaryLayout(names, tuple(dtypes), tuple(shapes), tuple(offsets), offset, options, one_id, block)


def parse_json(raw: bytes) -> Any:
    """JSON text -> Python values; raises json.JSONDecodeError (or UnicodeDecodeError), or RequestError naming
    where an integer too large for 64 bits stands.

    orjson when it is installed (3 to 7 times faster on the number lists of tensors); what it refuses
    (NaN literals, numbers beyond its range) goes to the standard parser, so that both give every
    request the same answer. An integer literal that fits neither int64 nor uint64 (10**400, 5,000 digits)
    is a 400 naming its place in the body ("labels[0].label") and its first digits, never converted: the
    standard parser would spend quadratic time on a long one, or raise an error that is not a request's.
    orjson reads an integer beyond 64 bits that a float can hold (30 digits) as that float, silently, so a
    body with a number token of 20 digits or more, or a minus and 19 (every such integer; a string of digits
    may look like one, a fraction's digits do not), goes to the standard parser. Nesting deeper than the standard parser's recursion allows is a
    JSONDecodeError too (a request, not a server fault).
    """
    if _orjson is not None and not _may_hold_big_integers(raw):
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    found: list[tuple[int, str]] = []  # the integer literals too large: (digits, the first of them)
    try:
        value = json.loads(raw, parse_int=functools.partial(_parse_int, found=found))
    except RecursionError:
        raise json.JSONDecodeError("arrays or objects nested too deeply", "", 0) from None
    if found:
        where = _path_of(value, _TooLarge)
        digits, shown = found[0]
        raise RequestError(
            f"field {where!r}: an integer of {digits} digits ({shown}); JSON integers must fit in 64 bits "
            f"(-2**63 .. 2**64 - 1)"
        )
    return value


INT64_MIN, UINT64_MAX = -(1 << 63), (1 << 64) - 1
INT64_MAX = (1 << 63) - 1


class _TooLarge:
    """Stands in the parsed value for an integer literal beyond 64 bits, until parse_json finds its place."""


# An integer literal beyond 64 bits has 20 digits, or a minus and 19 (2**64, -2**63 - 1), and starts a token:
# after one of , [ : or white space, where a fraction's digits follow a "." and an exponent's an "e". With the
# digits mapped to "0" and every other character but . e E + - to ",", two searches find them: 0.5 ms for a
# 385 KB body of floats, half of orjson's parse (regular expressions for a digit run took 3 to 6 ms).
_TOKENS = bytes(0x30 if 0x30 <= c <= 0x39 else c if c in b".eE+-" else 0x2C for c in range(256))
_TWENTY_DIGITS, _MINUS_NINETEEN = b"," + b"0" * 20, b",-" + b"0" * 19


def _may_hold_big_integers(raw: bytes) -> bool:
    """Whether the JSON text has an integer literal of 20 digits or more, or a minus and 19 (or a string of them)."""
    zeros = b"," + (raw if isinstance(raw, bytes | bytearray) else bytes(raw)).translate(_TOKENS)
    return _TWENTY_DIGITS in zeros or _MINUS_NINETEEN in zeros
_SHOWN_DIGITS = 40  # digits of a refused integer shown in the error


def _parse_int(text: str, found: list[tuple[int, str]]) -> int | _TooLarge:
    if len(text) <= 20:  # 20 characters hold every 64-bit integer; int() of them is cheap
        v = int(text)
        if INT64_MIN <= v <= UINT64_MAX:
            return v
    digits = len(text.lstrip("-"))
    sign = len(text) - digits
    # never the whole literal in the answer: it may have 5,000 digits
    found.append((digits, text if digits <= _SHOWN_DIGITS else f"{text[: sign + _SHOWN_DIGITS]}..."))
    return _TooLarge()


def _path_of(value: Any, kind: type) -> str:
    """The JSON path ("a.b[3]") of the first instance of `kind` inside `value` ("" when it is the value)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, kind):
            return path or "(the body)"
        if isinstance(v, dict):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return "(the body)"


def dump_json(value: Any) -> bytes:
    """Python values -> compact JSON bytes (orjson when installed: a response is written in microseconds).
    Both writers refuse what JSON cannot hold; orjson would write a NaN as null, so a float that is not
    finite is refused here as the standard writer (allow_nan=False) refuses it."""
    if _orjson is not None:
        out = _orjson.dumps(value)
        if b"null" in out and _has_nan(value):
            raise ValueError("dump_json: a value is NaN or infinite (not JSON)")
        return out
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _has_nan(value: Any) -> bool:
    match value:
        case float():
            return not math.isfinite(value)
        case dict():
            return any(_has_nan(v) for v in value.values())
        case list() | tuple():
            return any(_has_nan(v) for v in value)
        case _:
            return False


def to_model_inputs(
    tensors: Mapping[str, np.ndarray], signature: Signature, live: LiveFields = ONE_VERSION
) -> ModelInputs:
    """Named tensors (see the module docstring) -> ModelInputs, or RequestError. Inputs the signature does not
    take but another loaded version of the model does (`live.inputs`) are ignored, not read."""
    inline = {VECTOR_PREFIX + name: dim for name, dim in signature.vectors}
    known = signature.input_names()
    if not known.issuperset(tensors):
        unknown = sorted(set(tensors) - known - live.inputs)
        if unknown:
            raise RequestError(f"unknown inputs {unknown}; {_takes(signature, live)}")
    missing = [f for f in signature.features if f not in tensors]
    if signature.num_dense and "dense" not in tensors:
        missing.insert(0, "dense")
    if missing:
        who = "this version" if live.versions > 1 else "the model"
        raise RequestError(f"missing inputs {missing}; {who} takes {_expected(signature)}")
    sizes: dict[str, int] = {}
    dense = None
    if "dense" in tensors:
        d = tensors["dense"]
        if d.ndim != 2 or d.shape[1] != signature.num_dense:
            others = sorted(live.dense - {signature.num_dense})
            hint = f" (other loaded versions of the model take {others} dense values)" if others else ""
            raise RequestError(f"input 'dense' must have shape [B, {signature.num_dense}], got {list(d.shape)}{hint}")
        if d.dtype.kind not in "iuf":
            raise RequestError(f"input 'dense' must be numbers, got {d.dtype}")
        with np.errstate(over="ignore"):  # values beyond float32 become inf, refused just below
            dense = np.array(d, dtype=np.float32)  # a writable copy (binary tensors are read-only views)
        _check_dense(dense, signature)
        sizes["dense"] = dense.shape[0]
    ids = {}
    for f in signature.features:
        values, lengths = _jagged(f, tensors[f], tensors.get(f + LENGTHS_SUFFIX))
        if signature.max_ids is not None and lengths.size and int(lengths.max()) > signature.max_ids:
            row = int(np.flatnonzero(lengths > signature.max_ids)[0])
            raise RequestError(
                f"input {f!r} has {int(lengths[row])} ids in example {row}; this model takes at most {signature.max_ids}"
            )
        ids[f] = (values, lengths)
        sizes[f] = lengths.shape[0]
    vectors = {}
    for key, dim in inline.items():
        if key in tensors:
            vectors[key[len(VECTOR_PREFIX) :]] = _inline_vector(key, tensors[key], dim)
            sizes[key] = tensors[key].shape[0]
    if len(set(sizes.values())) > 1:
        raise RequestError(f"inputs disagree on the batch size: {sizes}")
    b = next(iter(sizes.values()))
    if b == 0:
        raise RequestError("the request has no examples (batch size 0)")
    if b > signature.max_rows:
        raise RequestError(f"the request has {b} examples; this server takes at most {signature.max_rows}", status=413)
    if dense is None:
        dense = np.zeros((b, 0), np.float32)
    return ModelInputs(dense, ids, vectors=vectors)


def _check_dense(dense: np.ndarray, signature: Signature) -> None:
    """inf is refused; NaN too, unless the model reads it as a missing value (signature.missing_values)."""
    bad = ~np.isfinite(dense)
    if signature.missing_values:
        bad &= ~np.isnan(dense)
    if bad.any():
        missing = "inf" if signature.missing_values else "NaN or inf"
        raise RequestError(f"input 'dense' contains {missing} (or values too large for float32)")


VECTOR_PREFIX = "vector."  # inline vector inputs: `vector.<name>` FP32 [B, dim]


def _inline_vector(key: str, t: np.ndarray, dim: int) -> np.ndarray:
    """An inline vector input [B, dim] of finite numbers -> float32, or RequestError naming it."""
    if t.ndim != 2 or t.shape[1] != dim:
        raise RequestError(f"input {key!r} must have shape [B, {dim}], got {list(t.shape)}")
    if t.dtype.kind not in "iuf":
        raise RequestError(f"input {key!r} must be numbers, got {t.dtype}")
    with np.errstate(over="ignore"):
        out = np.array(t, dtype=np.float32)
    if not np.isfinite(out).all():
        row = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise RequestError(f"input {key!r} row {row} contains NaN or inf (or values too large for float32)")
    return out


def _jagged(name: str, ids: np.ndarray, lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if ids.dtype.kind not in "iu":
        raise RequestError(f"input {name!r} must hold integer ids, got {ids.dtype}")
    if ids.dtype == np.uint64 and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
        raise RequestError(f"input {name!r} has ids above the int64 range")
    values = ids.astype(np.int64, copy=False)
    if lengths is not None:
        if values.ndim != 1 or lengths.ndim != 1:
            raise RequestError(
                f"with {name + LENGTHS_SUFFIX!r}, input {name!r} must be [N] and the lengths [B]; got "
                f"{list(values.shape)} and {list(lengths.shape)}"
            )
        if lengths.dtype.kind not in "iu" or (lengths.size and int(lengths.min()) < 0):
            raise RequestError(f"input {name + LENGTHS_SUFFIX!r} must be non-negative integers")
        if int(lengths.sum()) != values.shape[0]:
            raise RequestError(
                f"input {name + LENGTHS_SUFFIX!r} sums to {int(lengths.sum())} but {name!r} has {values.shape[0]} ids"
            )
        return values, lengths.astype(np.int32)
    match values.ndim:
        case 1:  # one id per example
            return values, _ones(values.shape[0])
        case 2:  # [B, L] padded with -1
            keep = values != PADDING
            return values[keep], keep.sum(axis=1).astype(np.int32)  # row-major keeps each example's ids together
        case _:
            raise RequestError(
                f"input {name!r} must be [B], [B, L] or [N] with lengths; got shape {list(values.shape)}"
            )


@functools.lru_cache(maxsize=64)
def _ones(b: int) -> np.ndarray:
    """Lengths of B one-id bags; shared (read-only), since every one-id feature of every request needs them."""
    ones = np.ones(b, np.int32)
    ones.flags.writeable = False
    return ones


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary part) of a body; the binary part is a view of the body (never a copy of it)."""
    if header_length is None:
        return body, b""
    if not header_length.isdigit() or len(header_length) > 18:
        raise RequestError(f"{HEADER_LENGTH} must be an integer, got {header_length[:30]!r}")
    n = int(header_length)
    if not 0 < n <= len(body):
        raise RequestError(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    view = memoryview(body)
    return bytes(view[:n]), view[n:]  # type: ignore[return-value]  # a memoryview reads like bytes here


def decode_tensor(spec: object, i: int, blob: bytes, offset: int, max_rows: int) -> tuple[str, np.ndarray, int]:
    name, shape, count, datatype, size = _tensor_spec(spec, i, max_rows)
    dtype = _DTYPES[datatype]
    if size is not None:
        if size < 0 or offset + size > len(blob):
            raise RequestError(
                f"input {name!r}: binary_data_size {size!r} does not fit the {len(blob) - offset} bytes left"
            )
        if size != count * dtype.itemsize:
            raise RequestError(
                f"input {name!r}: {size} bytes of binary data for shape {shape} of {datatype} ({count * dtype.itemsize} expected)"
            )
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
        return name, array, offset + size
    assert type(spec) is dict  # checked by _tensor_spec
    if "data" not in spec:
        raise RequestError(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
    try:
        array = np.asarray(spec["data"])
    except ValueError as e:  # ragged nested lists
        raise RequestError(f"input {name!r}: 'data' is not a regular array: {e}") from None
    if array.size != count:
        raise RequestError(f"input {name!r}: shape {shape} needs {count} values, 'data' has {array.size}")
    if array.dtype == dtype:  # JSON integers as INT64, floats as FP64: nothing to check or convert
        return name, array.reshape(shape), offset
    allowed = "iu" if datatype in _INT_TYPES else "iuf"
    if array.size and array.dtype.kind not in allowed:
        kind = "integers" if datatype in _INT_TYPES else "numbers"
        raise RequestError(f"input {name!r}: datatype {datatype} needs {kind} in 'data', got {array.dtype} values")
    if datatype in _INT_TYPES and array.size:
        info = np.iinfo(dtype)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise RequestError(f"input {name!r}: values out of the {datatype} range")
    with np.errstate(over="ignore"):  # floats beyond the declared type become inf; the model inputs refuse them
        return name, array.astype(dtype).reshape(shape), offset


def _tensor_spec(spec: object, i: int, max_rows: int) -> tuple[str, list[int], int, str, int | None]:
    """One entry of 'inputs' -> (name, shape, element count, datatype, binary_data_size or None).

    The element count is paid for by the body (JSON values or binary bytes), but a shape with a zero
    in it is not: [2^40, 0] holds nothing yet its lengths would be 2^40 ints. So no dimension may
    exceed max(max_rows, element count), checked here, before anything is allocated.
    """
    # `type(x) is int` also refuses bools (JSON true/false); this runs once per tensor of every request
    if type(spec) is not dict:
        raise RequestError(f"inputs[{i}] must be an object, got {type(spec).__name__}")
    name = spec.get("name")
    if type(name) is not str or not name:
        raise RequestError(f"inputs[{i}] needs a 'name'")
    shape = spec.get("shape")
    count = 1
    if type(shape) is list:
        for s in shape:
            if type(s) is not int or s < 0:
                count = -1
                break
            count *= s
    if count < 0 or type(shape) is not list:
        raise RequestError(f"input {name!r}: 'shape' must be a list of non-negative ints, got {shape!r}")
    if shape and max(shape) > max(max_rows, count):
        raise RequestError(
            f"input {name!r}: shape {shape} has a dimension above {max(max_rows, count)} (the server takes at most "
            f"{max_rows} examples and the tensor holds {count} values)"
        )
    datatype = spec.get("datatype")
    if type(datatype) is not str or datatype not in _NUMBER_TYPES:
        raise RequestError(
            f"input {name!r}: datatype {datatype!r} is not supported; use one of {sorted(_NUMBER_TYPES)}"
        )
    params = spec.get("parameters")
    if params is not None and type(params) is not dict:
        raise RequestError(f"input {name!r}: 'parameters' must be an object")
    size = params.get("binary_data_size") if params else None
    if size is not None and type(size) is not int:
        raise RequestError(f"input {name!r}: binary_data_size {size!r} is not a number of bytes")
    return name, shape, count, datatype, size


def _options(request: Mapping[str, Any]) -> InferOptions:
    request_id = request.get("id")
    params = request.get("parameters") or {}
    binary_all = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    wanted = request.get("outputs")
    if wanted is None:
        return InferOptions(
            None if request_id is None else str(request_id), OUTPUTS, frozenset(OUTPUTS) if binary_all else frozenset()
        )
    if not isinstance(wanted, list):
        raise RequestError("'outputs' must be a list")
    names: list[str] = []
    binary: set[str] = set()
    for spec in wanted:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in OUTPUTS:
            raise RequestError(f"unknown output {name!r}; the model has {list(OUTPUTS)}")
        names.append(name)
        p = spec.get("parameters") or {}
        if (isinstance(p, dict) and p.get("binary_data", binary_all)) or (not isinstance(p, dict) and binary_all):
            binary.add(name)
    return InferOptions(None if request_id is None else str(request_id), tuple(names), frozenset(binary))


def encode_infer_response(
    model: str, version: str, options: InferOptions, outputs: Mapping[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """Outputs -> (body, extra headers): JSON, or JSON header + binary tensors for `options.binary`."""
    # the JSON is written out directly: output names come from OUTPUTS, the only free strings (model,
    # version, id) go through json.dumps; a third of the cost of json.dumps on the whole response
    described: list[str] = []
    blobs: list[bytes] = []
    for name in options.outputs:
        array = np.ascontiguousarray(outputs[name], dtype="<f4")
        head = f'{{"name":"{name}","datatype":"FP32","shape":[{",".join(map(str, array.shape))}],'
        if name in options.binary:
            raw = array.tobytes()
            described.append(f'{head}"parameters":{{"binary_data_size":{len(raw)}}}}}')
            blobs.append(raw)
        else:
            described.append(f'{head}"data":{json.dumps(array.ravel().tolist(), separators=(",", ":"))}}}')
    request_id = "" if options.request_id is None else f',"id":{json.dumps(options.request_id)}'
    header = (
        f'{{"model_name":{json.dumps(model)},"model_version":{json.dumps(version)},'
        f'"outputs":[{",".join(described)}]{request_id}}}'
    ).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"}


def decode_instances(
    instances: object, signature: Signature, dense_names: Sequence[str] | None = None, live: LiveFields = ONE_VERSION
) -> ModelInputs:
    """/predict rows of already-encoded features -> ModelInputs.

    Each instance is {"dense": [Dd numbers]} (or one key per dense column in `dense_names`) plus
    {"<feature>": id or [ids]} for every sparse feature. Keys only other loaded versions of the model take
    (`live.keys`) are ignored; any other unknown key is refused, and so is a missing one this version needs.
    A positional "dense" list fits only a version of its length: across a change of the dense columns
    (a stable and a canary of different schemas) clients send dense features by name.
    """
    if not isinstance(instances, list) or not instances:
        raise RequestError("'instances' must be a non-empty list of objects")
    if len(instances) > signature.max_rows:
        raise RequestError(f"{len(instances)} instances; this server takes at most {signature.max_rows}", status=413)
    dense_rows: list[list[Any]] = []
    ids: dict[str, list[list[Any]]] = {f: [] for f in signature.features}
    named = tuple(dense_names or ())
    allowed = set(signature.features) | ({"dense"} if signature.num_dense else set()) | set(named)
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict):
            raise RequestError(f"instances[{i}] must be an object, got {type(inst).__name__}")
        if not allowed.issuperset(inst):
            unknown = sorted(set(inst) - allowed - live.keys)
            if unknown:
                where = "no loaded version of the model takes them; " if live.versions > 1 else ""
                raise RequestError(f"instances[{i}]: unknown features {unknown}; {where}expected {sorted(allowed)}")
        if signature.num_dense:
            dense_rows.append(_dense_row(i, inst, signature.num_dense, named, live))
        for f in signature.features:
            if f not in inst:
                raise RequestError(f"instances[{i}]: missing feature {f!r}")
            v = inst[f]
            ids[f].append(v if isinstance(v, list) else [v])
    tensors: dict[str, np.ndarray] = {}
    if signature.num_dense:
        tensors["dense"] = _array("dense", dense_rows, "iuf")
    for f, lists in ids.items():
        tensors[f] = _array(f, [x for row in lists for x in row], "iu").reshape(-1)
        tensors[f + LENGTHS_SUFFIX] = np.array([len(row) for row in lists], np.int32)
    return to_model_inputs(tensors, signature)


def _dense_row(i: int, inst: Mapping[str, Any], width: int, named: Sequence[str], live: LiveFields) -> Any:
    """Instance i's dense values: by name when every dense column is there, else its positional "dense" list."""
    if named and all(n in inst for n in named):
        return [inst[n] for n in named]
    if "dense" in inst:
        row = inst["dense"]
        if isinstance(row, list) and len(row) != width:
            others = sorted(live.dense - {width})
            hint = ""
            if others:
                by_name = f" ({list(named)})" if named else ""
                hint = (
                    f"; other loaded versions of the model take {others}: a positional 'dense' list fits one "
                    f"version only, send the dense features by name{by_name} to be answered by any"
                )
            raise RequestError(f"instances[{i}]: 'dense' has {len(row)} values, this version takes {width}{hint}")
        return row
    missing = [n for n in named if n not in inst]
    if named and len(missing) < len(named):
        raise RequestError(f"instances[{i}]: missing dense features {missing}")
    by_name = f" or the dense features {list(named)} by name" if named else ""
    raise RequestError(f"instances[{i}]: needs 'dense' (a list of {width} numbers){by_name}")


def _array(name: str, data: object, kinds: str) -> np.ndarray:
    try:
        array = np.asarray(data)
    except ValueError as e:
        raise RequestError(f"feature {name!r}: not a regular array: {e}") from None
    if array.size and array.dtype.kind not in kinds:
        raise RequestError(
            f"feature {name!r}: expected {'integer ids' if kinds == 'iu' else 'numbers'}, got {array.dtype} values"
        )
    return array if array.size else array.astype(np.int64 if kinds == "iu" else np.float32)


def _expected(signature: Signature) -> list[str]:
    return (["dense"] if signature.num_dense else []) + list(signature.features)


def _takes(signature: Signature, live: LiveFields) -> str:
    """The end of an "unknown inputs" message: what the model takes (with other versions: that none takes them)."""
    if live.versions > 1:
        return f"no loaded version of the model takes them (this version takes {_expected(signature)})"
    return f"the model takes {_expected(signature)}"
