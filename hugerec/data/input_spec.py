"""InputSpec: what a user's raw files look like (format, separator, header, encoding, columns with their
types and roles), as a config's [preprocess] section declares it, and what follows from it.

    spec = InputSpec(format=InputFormat.CSV, separator="::", header=False, columns=(
        ColumnSpec("user", "int", "user"), ColumnSpec("item", "int", "item"),
        ColumnSpec("rating", "int", "label", threshold=4), ColumnSpec("time", "timestamp")))
    spec.dataset("ratings.dat")         -> a preprocessing Dataset reading exactly these columns
    spec.input_ops(dataset.schema)      -> [ParseTime(time), Binarize(rating >= 4)]: the ops that turn the declared types
                                           into model-ready values (times, lists, labels), first in the workflow
    default_ops(spec, ...)              -> FillMissing/LogOp/Normalize on dense, Categorify on categorical
    infer_spec("clicks.csv")            -> a spec guessed from a sample, written as TOML by `spec_to_toml`

Column types say how a field is read: int, float, string, list (several values in one field, split by
the column's `separator`) and timestamp (`format`: "unix" seconds, "unix_ms", or a strptime format).
Roles say what a column is for: label (0/1, or `threshold`: value >= threshold is a positive), dense,
categorical (one embedding table; a list column is multi-hot), user / item / session (categorical ids
that the splits and sequence ops also use), timestamp (read by time ops and time splits) and none
(read, then dropped).
"""

from __future__ import annotations

import enum
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from hugerec.data.preprocess.dataset import CsvOptions, Dataset, Format, read_header, read_text_head
from hugerec.data.preprocess.grouping import Groupby
from hugerec.data.preprocess.lists import SplitList
from hugerec.data.preprocess.numeric import Binarize, FillMissing, LogOp, Normalize
from hugerec.data.preprocess.op import Op
from hugerec.data.preprocess.temporal import ParseTime
from hugerec.data.schema import ColumnKind, Schema

if TYPE_CHECKING:  # the workflow's ops load Numba kernels: `hugerec schema` reads a sample without them
    from hugerec.data.preprocess.workflow import Workflow


class InputFormat(enum.Enum):
    CSV = "csv"  # delimited text (CSV, TSV, "::"...), plain or .gz, with or without a header line
    PARQUET = "parquet"  # Parquet files; column types come from the files


class ColumnType(enum.Enum):
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    LIST = "list"  # several values in one text field, split by the column's `separator`
    TIMESTAMP = "timestamp"  # epoch numbers or text, parsed by the column's `format`


class Role(enum.Enum):
    LABEL = "label"
    DENSE = "dense"
    CATEGORICAL = "categorical"
    USER = "user"
    ITEM = "item"
    SESSION = "session"
    TIMESTAMP = "timestamp"
    NONE = "none"


ID_ROLES = (Role.CATEGORICAL, Role.USER, Role.ITEM, Role.SESSION)
_DEFAULT_ROLE = {
    ColumnType.INT: Role.DENSE,
    ColumnType.FLOAT: Role.DENSE,
    ColumnType.STRING: Role.CATEGORICAL,
    ColumnType.LIST: Role.CATEGORICAL,
    ColumnType.TIMESTAMP: Role.TIMESTAMP,
}


@dataclass(frozen=True)
class ColumnSpec:
    """One column. type: int | float | string | list | timestamp; role: label | dense | categorical |
    user | item | session | timestamp | none (default: dense for numbers, categorical for text and
    lists, timestamp for timestamps); separator: a list column's value separator; format: a timestamp's
    "unix" | "unix_ms" | strptime format; threshold: a label read as `value >= threshold`."""

    name: str  # the column's name (with a header: as the header spells it)
    type: ColumnType = ColumnType.STRING
    role: Role | None = None
    separator: str = "|"
    format: str = "unix"
    threshold: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"column name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "type", ColumnType(self.type))
        object.__setattr__(self, "role", Role(self.role) if self.role is not None else _DEFAULT_ROLE[self.type])
        if self.type is ColumnType.TIMESTAMP:
            ParseTime((self.name,), self.format)  # its own checks of the format, now
        if self.threshold is not None and self.role is not Role.LABEL:
            raise ValueError(f"column {self.name!r}: threshold is for label columns, this one is {self.role_value}")
        if self.role is Role.LABEL and self.type not in (ColumnType.INT, ColumnType.FLOAT):
            raise ValueError(f"column {self.name!r}: a label must be int or float, got {self.type.value}")
        if self.role is Role.DENSE and self.type not in (ColumnType.INT, ColumnType.FLOAT):
            raise ValueError(
                f"column {self.name!r}: a dense column must be int or float, got {self.type.value} "
                "(text is role = \"categorical\")"
            )
        if self.type is ColumnType.LIST and self.role not in (*ID_ROLES, Role.NONE):
            raise ValueError(f"column {self.name!r}: a list column is categorical (multi-hot), not {self.role_value}")
        if self.type is ColumnType.LIST and not self.separator:
            raise ValueError(f"column {self.name!r}: separator must not be empty")

    @property
    def role_value(self) -> str:
        assert self.role is not None  # set in __post_init__
        return self.role.value

    def polars_dtype(self) -> pl.DataType:
        """How the field is read from text (lists and formatted times are text, turned by input_ops)."""
        match self.type:
            case ColumnType.INT:
                return pl.Int64()
            case ColumnType.FLOAT:
                return pl.Float32()
            case ColumnType.TIMESTAMP if self.format in ("unix", "unix_ms"):
                return pl.Float64()  # "1396860669.277" and "978300760" alike; ParseTime floors to Int64 seconds
            case _:
                return pl.String()


@dataclass(frozen=True)
class InputSpec:
    """Raw input files. format: csv | parquet | criteo; separator (any string, "\\t" for TSV, "::" for
    MovieLens), header, encoding, quote (none: no quoting), null_values: text files only; columns: every
    field in file order for text without a header, the columns to use otherwise (others are read and
    dropped); Parquet without columns: all of its columns, roles guessed by infer_parquet_spec."""

    format: InputFormat = InputFormat.CSV
    separator: str = ","
    header: bool = True
    encoding: str = "utf-8"
    quote: str | None = '"'
    null_values: tuple[str, ...] = ()
    columns: tuple[ColumnSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", InputFormat(self.format))
        self.csv_options()  # separator / encoding / quote checks, now
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"columns: {dup} declared twice")

    @staticmethod
    def criteo() -> InputSpec:
        """The Criteo Kaggle / Terabyte TSV: label, I1..I13 integer counts, C1..C26 hex ids; empty = missing."""
        columns = [ColumnSpec("label", ColumnType.INT, Role.LABEL)]
        columns += [ColumnSpec(f"I{i}", ColumnType.INT, Role.DENSE) for i in range(1, 14)]
        columns += [ColumnSpec(f"C{i}", ColumnType.STRING, Role.CATEGORICAL) for i in range(1, 27)]
        return InputSpec(InputFormat.CSV, "\t", header=False, quote=None, columns=tuple(columns))

    def resolved(self, paths: str | Path | Sequence[str | Path]) -> InputSpec:
        """This spec with its columns: Parquet without declared columns gets those of a schema.json beside
        the files (what `hugerec synth` writes) or, without one, the ones infer_parquet_spec guesses."""
        if self.columns or self.format is not InputFormat.PARQUET:
            return self
        first = Path(str(paths)) if isinstance(paths, str | Path) else Path(str(paths[0]))
        folder = first if first.is_dir() else first.parent
        if (folder / "schema.json").is_file():
            return InputSpec.from_schema(Schema.load(folder / "schema.json"))
        probe = Dataset(paths, format=Format.PARQUET, schema={"_": pl.Null()})
        _require_parquet(probe.paths[0], "input")
        return infer_parquet_spec(probe.paths[0])

    @staticmethod
    def from_schema(schema: Schema) -> InputSpec:
        """The Parquet input a `schema.json` describes (what `hugerec synth` and `readers.to_parquet` write)."""
        columns = []
        for c in schema.columns:
            match c.kind:
                case ColumnKind.LABEL:
                    columns.append(ColumnSpec(c.name, ColumnType.FLOAT, Role.LABEL))
                case ColumnKind.DENSE:
                    columns.append(ColumnSpec(c.name, ColumnType.FLOAT, Role.DENSE))
                case ColumnKind.SPARSE:
                    kind = ColumnType.LIST if c.multi_hot else ColumnType.INT
                    columns.append(ColumnSpec(c.name, kind, Role.CATEGORICAL))
        return InputSpec(format=InputFormat.PARQUET, columns=tuple(columns))

    def csv_options(self) -> CsvOptions:
        return CsvOptions(self.separator, self.header, self.quote, self.null_values, self.encoding)

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def names_with_role(self, *roles: Role) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.role in roles)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.names_with_role(Role.LABEL)

    def dataset(self, paths: str | Path | Sequence[str | Path], where: str = "input") -> Dataset:
        """The Dataset reading these files: declared columns typed, labels checked (0/1 unless a threshold
        makes them), undeclared header columns read as text and dropped later."""
        if not self.columns:
            raise ValueError(f"{where}: declare the columns (run `hugerec schema FILE` to write them)")
        match self.format:
            case InputFormat.PARQUET:
                folder = Path(str(paths))
                files = str(folder / "*.parquet") if isinstance(paths, str | Path) and folder.is_dir() else paths
                ds = Dataset(files, format=Format.PARQUET, schema=None)
                for path in ds.paths:
                    _require_parquet(path, where)
                missing = [c.name for c in self.columns if c.name not in ds.schema]
                if missing:
                    raise ValueError(f"{where}: {ds.paths[0]} has no column(s) {missing}; it has {list(ds.schema)}")
                schema = {c.name: _parquet_dtype(c, ds.schema[c.name]) for c in self.columns}
                return Dataset(ds.paths, format=Format.PARQUET, schema=schema, binary=self._binary())
            case InputFormat.CSV:
                csv = self.csv_options()
                probe = Dataset(paths, format=Format.CSV, schema={"_": pl.String()}, csv=csv)
                for path in probe.paths:
                    _require_text(path, where)
                declared = {c.name: c.polars_dtype() for c in self.columns}
                key = header_key(where)
                if self.header:
                    header = read_header(probe.paths[0], csv)
                    missing = [n for n in declared if n not in header]
                    if missing:
                        raise ValueError(
                            f"{where}: {probe.paths[0]} header {header} lacks the declared column(s) {missing}"
                            f" (a file without a header line: {key} = false)"
                        )
                    dup = sorted({n for n in header if header.count(n) > 1})
                    if dup:
                        raise ValueError(f"{where}: {probe.paths[0]} header names {dup} more than once")
                    for path in probe.paths[1:]:
                        if read_header(path, csv) != header:
                            raise ValueError(f"{where}: {path} has another header than {probe.paths[0]}: {header}")
                    schema = {n: declared.get(n, pl.String()) for n in header}
                else:
                    for path in probe.paths:  # a header line would be read as a row (and fail, or worse, not)
                        try:
                            first = read_header(path, csv)
                        except ValueError:  # empty, or an empty first line: no header either way
                            continue
                        if first == list(declared):
                            raise ValueError(f"{where}: {path} starts with a header line {first}; set {key} = true")
                    schema = declared
                return Dataset(probe.paths, format=Format.CSV, schema=schema, csv=csv, binary=self._binary())

    def _binary(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.role is Role.LABEL and c.threshold is None)

    def input_ops(self, read_as: Mapping[str, pl.DataType]) -> list[Op]:
        """Declared types -> model-ready values: timestamps to epoch seconds, list fields read as text
        split, labels with a threshold made 0/1. First in every workflow built from this spec; `read_as`
        is the dataset's schema (a Parquet list column is a list already)."""
        ops: list[Op] = []
        times: dict[str, list[str]] = {}
        for c in self.columns:
            if c.type is ColumnType.TIMESTAMP:
                times.setdefault(c.format, []).append(c.name)
        ops += [ParseTime(tuple(names), fmt) for fmt, names in times.items()]
        lists: dict[str, list[str]] = {}
        for c in self.columns:
            if c.type is ColumnType.LIST and read_as.get(c.name) == pl.String:
                lists.setdefault(c.separator, []).append(c.name)
        ops += [SplitList(tuple(names), sep) for sep, names in lists.items()]
        for c in self.columns:
            if c.threshold is not None:
                ops.append(Binarize((c.name,), c.threshold))
        return ops


def _require_parquet(path: str, where: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PAR1":
        raise ValueError(
            f"{where}: {path} is not a Parquet file (it starts with {magic!r}, not b'PAR1'); "
            'for delimited text set format = "csv" and declare its columns (`hugerec schema FILE` writes them)'
        )


def _require_text(path: str, where: str) -> None:
    magic = read_text_head(path, 4)
    if magic == b"PAR1":
        raise ValueError(f'{where}: {path} is a Parquet file; set format = "parquet"')


def _parquet_dtype(column: ColumnSpec, stored: pl.DataType) -> pl.DataType:
    """A Parquet column is read with its stored type, unless the declared type asks for another kind."""
    want = column.polars_dtype()
    if column.type is ColumnType.LIST and isinstance(stored, pl.List):
        return stored  # already a list per row
    if (want.is_numeric() and stored.is_numeric()) or want == stored:
        return want if column.type is ColumnType.FLOAT else stored
    return want


def infer_parquet_spec(path: str) -> InputSpec:
    """Roles from a Parquet file's types and names (see `_guess_role`); no schema.json needed."""
    sample = pl.read_parquet(path, n_rows=10_000)
    columns = [_guess_column(name, sample[name]) for name in sample.columns]
    return InputSpec(format=InputFormat.PARQUET, columns=tuple(_one_label(columns)))


def header_key(where: str) -> str:
    """The config key that says whether the files of `where` start with a header line: each of
    preprocess's inputs has its own (input: header, eval_input: eval_header, test_input: test_header);
    other raw files (evaluate's and predict's) are read as the input is."""
    match where:
        case "preprocess.eval_input" | "preprocess.test_input":
            return where.removesuffix("_input") + "_header"
        case _:
            return "preprocess.header"


# -- the default workflow and the output schema ------------------------------------------------------
def default_ops(
    spec: InputSpec, *, log_dense: bool = False, min_frequency: int = 1, max_vocab: int | None = None
) -> list[Op]:
    """The workflow a config without [[preprocess.ops]] gets: FillMissing(0) + (LogOp) + Normalize on dense
    columns, Categorify on categorical ones (user / item / session ids included)."""
    from hugerec.data.preprocess.categorical import Categorify  # Numba kernels: loaded when a workflow is built

    dense = spec.names_with_role(Role.DENSE)
    sparse = spec.names_with_role(*ID_ROLES)
    ops: list[Op] = []
    if dense:
        ops.append(FillMissing(dense, 0.0))
        if log_dense:
            ops.append(LogOp(dense))
        ops.append(Normalize(dense))
    if sparse:
        ops.append(Categorify(sparse, freq_threshold=min_frequency, max_size=max_vocab))
    return ops


def output_columns(spec: InputSpec, ops: Sequence[Op]) -> tuple[str, ...] | None:
    """What the workflow keeps: labels, declared dense and id columns, and every column the config's `ops`
    write; raw timestamps, role = "none" and undeclared columns are dropped unless an op rewrote them.
    None (everything) after a Groupby, which replaces all columns by its own."""
    if any(isinstance(op, Groupby) for op in ops):
        return None
    keep = [c.name for c in spec.columns if c.role is Role.LABEL or c.role is Role.DENSE or c.role in ID_ROLES]
    for op in ops:
        keep += [c for c in op.writes() if c not in keep]
    return tuple(keep)


def model_schema(spec: InputSpec, workflow: Workflow, where: str = "preprocess") -> Schema:
    """The trainable shards' schema: labels, id columns (sparse, with cardinalities; lists are multi-hot)
    and numeric columns (dense). A column left as text, or a declared id column no op turned into ids,
    is an error naming it."""
    out = workflow.output_schema()
    cards = workflow.cardinalities()
    labels = [c for c in spec.labels if c in out]
    dense: list[str] = []
    sparse: dict[str, int] = {}
    multi: list[str] = []
    for name, dtype in out.items():
        if name in labels:
            continue
        declared = next((c for c in spec.columns if c.name == name), None)
        if name in cards:
            sparse[name] = cards[name]
            if isinstance(dtype, pl.List):
                multi.append(name)
        elif declared is not None and declared.role in ID_ROLES:
            raise ValueError(
                f"{where}: column {name!r} has role {declared.role_value!r} but no op maps it to ids "
                "(add it to a Categorify or HashBucket op, or set its role to \"none\")"
            )
        elif dtype.is_numeric() or dtype == pl.Boolean:
            dense.append(name)
        else:
            raise ValueError(
                f"{where}: the workflow leaves column {name!r} as {dtype}, which a model cannot read; "
                "encode it (Categorify, HashBucket) or set its role to \"none\""
            )
    if not labels:
        raise ValueError(f'{where}: no label column; give one column role = "label"')
    return Schema.build(labels, dense, sparse, multi_hot=multi)


# -- inference from a sample ----------------------------------------------------------------------------
SEPARATORS = ("\t", "::", ",", ";", "|")
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S%.fZ", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")
_LABEL_NAMES = ("label", "click", "clicked", "target", "y", "is_click", "converted")
_TIME_NAME = re.compile(r"(time|date|^ts$|_ts$|timestamp)", re.I)
_ID_NAME = re.compile(r"(^id$|_id$|^user|^item|^movie|^session|id$)", re.I)
# integer codes by their name: C14 (the C<n> of click logs; not the c<n> given to headerless columns), *_type, *_pos
_CODE_NAME = re.compile(r"^C\d+$|_(type|pos|code|category)$")
MAX_CODES = 16  # an integer column with 3..MAX_CODES distinct values, not a run, is categorical (_few_codes)
INT64_RANGE = (-(2**63), 2**63 - 1)


def _sample_lines(path: str, max_bytes: int) -> list[bytes]:
    head = read_text_head(path, max_bytes)  # a damaged .gz: one line naming the file and where it breaks off
    lines = head.split(b"\n")
    if len(head) == max_bytes:
        lines = lines[:-1]  # the last one may be cut
    return [line.rstrip(b"\r") for line in lines if line.strip()]


def _guess_separator(lines: list[str]) -> str:
    best, best_score = ",", -1.0
    for sep in SEPARATORS:
        counts = [line.count(sep) for line in lines]
        if not counts or min(counts) == 0:
            continue
        mode = max(set(counts), key=counts.count)
        score = counts.count(mode) / len(counts) + (0.5 if sep in ("\t", "::") else 0.0)
        if score > best_score:
            best, best_score = sep, score
    return best


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _guess_header(first: list[str], rest: list[list[str]]) -> bool:
    """A header when no field of the first line is a number while some column below holds numbers, or
    when every first-line field is a distinct identifier-like word."""
    if any(_is_number(f) for f in first if f):
        return False
    numeric_below = any(all(_is_number(r[i]) for r in rest if i < len(r) and r[i]) for i in range(len(first)))
    names_like = len(set(first)) == len(first) and all(re.fullmatch(r"[A-Za-z_][\w .-]*", f) for f in first)
    return numeric_below or names_like


def infer_spec(
    path: str | Path,
    *,
    separator: str | None = None,
    header: bool | None = None,
    encoding: str = "utf-8",
    sample_bytes: int = 4 << 20,
) -> InputSpec:
    """A spec guessed from the first `sample_bytes` of `path` (Parquet: its first 10,000 rows): the separator
    (tab, "::", comma, semicolon, pipe), whether line 1 is a header, each column's type (numbers, text,
    "|"-separated lists, timestamps in epoch seconds or common date formats) and a role from the type and
    the name (a 0/1 column named like a label, or the first 0/1 column of a headerless file, is the label).
    Integers too long for int64 (20-digit ids) are text; integer columns named like ids or codes (`*_id`,
    `C14`, `*_type`, `*_pos`) or holding a few scattered values (codes: `_few_codes`) are categorical, other
    numbers dense.
    Meant to be written out (`schema_toml`) and edited: an integer id and a count cannot always be told apart."""
    return _infer(str(path), separator, header, encoding, sample_bytes)[0]


def schema_toml(
    path: str | Path, *, separator: str | None = None, header: bool | None = None, encoding: str = "utf-8"
) -> str:
    """`infer_spec` written as the [preprocess] section of a config, with sample values as comments."""
    spec, sample = _infer(str(path), separator, header, encoding, 4 << 20)
    return spec_to_toml(spec, str(path), {name: _examples(sample[name]) for name in sample.columns})


def _examples(values: pl.Series, n: int = 3) -> list[str]:
    """The first `n` distinct values of a column, as short text (lists included)."""
    seen: list[str] = []
    for v in values.drop_nulls().head(1000).to_list():
        text = str(v)[:24]
        if text not in seen:
            seen.append(text)
        if len(seen) == n:
            break
    return seen


def _infer(
    path: str, separator: str | None, header: bool | None, encoding: str, sample_bytes: int
) -> tuple[InputSpec, pl.DataFrame]:
    if Path(path).is_dir():
        raise ValueError(f"{path} is a folder; give one of its files")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            return infer_parquet_spec(path), pl.read_parquet(path, n_rows=1000)
    raw_lines = _sample_lines(path, sample_bytes)
    if not raw_lines:
        raise ValueError(f"{path}: empty file, nothing to infer a schema from")
    if encoding.lower() in ("utf-8", "utf8"):
        try:
            b"\n".join(raw_lines).decode("utf-8")
        except UnicodeDecodeError:
            encoding = "latin-1"  # not UTF-8: the usual single-byte encoding of older data sets (MovieLens)
    lines = [line.decode(encoding, errors="replace") for line in raw_lines[:200]]
    sep = separator or _guess_separator(lines)
    fields = [line.split(sep) for line in lines]
    has_header = _guess_header(fields[0], fields[1:]) if header is None else header
    csv = CsvOptions(sep, has_header, '"', (), encoding)
    body = csv.to_parser_bytes(b"\n".join(raw_lines) + b"\n")
    try:
        frame = pl.read_csv(
            io.BytesIO(body),
            separator=csv.byte_separator,
            has_header=has_header,
            infer_schema_length=len(raw_lines),
            truncate_ragged_lines=True,
        )
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{path}: cannot read a sample as {sep!r}-separated text: {str(e).splitlines()[0]}") from None
    if not has_header:
        frame = frame.rename({old: f"c{i}" for i, old in enumerate(frame.columns)})
    columns = [_guess_column(name, frame[name], i == 0 and not has_header) for i, name in enumerate(frame.columns)]
    spec = InputSpec(
        format=InputFormat.CSV,
        separator=sep,
        header=has_header,
        encoding=encoding,
        quote='"',
        columns=tuple(_one_label(columns)),
    )
    return spec, frame


def _guess_column(name: str, values: pl.Series, first: bool = False) -> ColumnSpec:
    dtype = values.dtype
    present = values.drop_nulls()
    if dtype.is_integer() and present.len():
        smallest, largest = int(present.min()), int(present.max())  # type: ignore[arg-type]
        if smallest < INT64_RANGE[0] or largest > INT64_RANGE[1]:  # a 20-digit id: only text holds it
            return ColumnSpec(name, ColumnType.STRING, Role.CATEGORICAL)
    if dtype.is_integer() or dtype.is_float():
        if present.len() and not _ID_NAME.search(name):
            low, high = float(present.min()), float(present.max())  # type: ignore[arg-type]
            # epoch seconds (or ms) between 1990 and 2100: a timestamp when named like one, or unnamed
            for fmt, scale in (("unix", 1), ("unix_ms", 1000)):
                plausible = 631_152_000 * scale <= low and high <= 4_102_444_800 * scale
                if plausible and (_TIME_NAME.search(name) or re.fullmatch(r"c\d+", name)):
                    return ColumnSpec(name, ColumnType.TIMESTAMP, Role.TIMESTAMP, format=fmt)
        zero_one = present.len() > 0 and bool(((present == 0) | (present == 1)).all())
        if zero_one and (name.lower() in _LABEL_NAMES or first):
            return ColumnSpec(name, ColumnType.INT if dtype.is_integer() else ColumnType.FLOAT, Role.LABEL)
        if dtype.is_integer() and (_ID_NAME.search(name) or _CODE_NAME.search(name) or _few_codes(present)):
            return ColumnSpec(name, ColumnType.INT, Role.CATEGORICAL)
        return ColumnSpec(name, ColumnType.INT if dtype.is_integer() else ColumnType.FLOAT, Role.DENSE)
    if isinstance(dtype, pl.List):
        return ColumnSpec(name, ColumnType.LIST, Role.CATEGORICAL)
    if dtype == pl.String and present.len():
        for fmt in TIME_FORMATS:
            if present.head(1000).str.strptime(pl.Datetime("us"), fmt, strict=False).is_not_null().all():
                return ColumnSpec(name, ColumnType.TIMESTAMP, Role.TIMESTAMP, format=fmt)
        if present.head(1000).str.contains("|", literal=True).mean() > 0.2:  # type: ignore[operator]
            return ColumnSpec(name, ColumnType.LIST, Role.CATEGORICAL, separator="|")
    return ColumnSpec(name, ColumnType.STRING, Role.CATEGORICAL)


def _few_codes(present: pl.Series) -> bool:
    """3..MAX_CODES distinct values, each seen about 10 times or more on average, scattered over more than
    twice as many integers as they are: codes (banner widths 320, 480, 728, 1024), not a count or a rating
    (1..5, or 0..6 with 5 never seen, stays dense, as does a 0/1 flag)."""
    distinct = present.n_unique()
    low, high = int(present.min()), int(present.max())  # type: ignore[arg-type]
    return 3 <= distinct <= MAX_CODES and present.len() >= 10 * distinct and high - low + 1 > 2 * distinct


def _one_label(columns: list[ColumnSpec]) -> list[ColumnSpec]:
    """At most one guessed label: later 0/1 columns become dense."""
    seen = False
    out = []
    for c in columns:
        if c.role is Role.LABEL:
            if seen:
                c = replace(c, role=Role.DENSE)
            seen = True
        out.append(c)
    return out


def spec_to_toml(spec: InputSpec, input_path: str, samples: dict[str, list[str]] | None = None) -> str:
    """The [preprocess] section for `spec`, one column per line with its sample values as a comment."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'

    lines = [
        "# Written by `hugerec schema`: check each column's type and role, then run `hugerec preprocess`.",
        "# types: int | float | string | list (separator = \"|\") | timestamp (format = \"unix\" | \"unix_ms\" | strptime)",
        "# roles: label (threshold = N: value >= N is a positive) | dense | categorical | user | item | session |",
        "#        timestamp | none (dropped)",
        "[preprocess]",
        f"input = {q(input_path)}",
        f"format = {q(spec.format.value)}",
    ]
    if spec.format is InputFormat.CSV:
        lines += [
            f"separator = {q(spec.separator)}",
            f"header = {'true' if spec.header else 'false'}",
            f"encoding = {q(spec.encoding)}",
        ]
    lines.append("columns = [")
    for c in spec.columns:
        parts = [f"name = {q(c.name)}", f"type = {q(c.type.value)}", f"role = {q(c.role_value)}"]
        if c.type is ColumnType.LIST:
            parts.append(f"separator = {q(c.separator)}")
        if c.type is ColumnType.TIMESTAMP:
            parts.append(f"format = {q(c.format)}")
        example = (samples or {}).get(c.name)
        comment = f"  # e.g. {', '.join(example)}" if example else ""
        lines.append(f"  {{ {', '.join(parts)} }},{comment}")
    lines.append("]")
    return "\n".join(lines) + "\n"
