"""Dataset: raw input files (CSV/TSV, plain or gzip; Parquet) or in-memory frames, cut into partitions.

A partition is the unit of parallel work; reading it yields chunks of bounded size, so memory is
bounded by the chunk size whatever the dataset size:

    plain text   partition = byte range of about `partition_bytes`, aligned to lines; one chunk
    gzip text    partition = the whole file (not seekable); chunks = blocks of about `partition_bytes`
    Parquet      partition = consecutive row groups of about `partition_bytes`; chunks = row groups
    frames       partition = one frame; one chunk

Every chunk is parsed with the dataset schema; a bad row raises `BadInputError` with its file, line
(or row group and row) and column, or is dropped and counted with `on_error=OnError.SKIP`.
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from hugerec.data.preprocess.errors import MAX_EXAMPLES, BadInputError, OnError, RowError, SkipReport

DEFAULT_PARTITION_BYTES = 32 << 20
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))


class Format(enum.Enum):
    CSV = "csv"
    PARQUET = "parquet"
    FRAME = "frame"


# What a multi-byte separator (MovieLens' "::") is rewritten to before parsing: the ASCII unit separator,
# a control byte that text data does not hold (a file that does is refused, naming its line).
UNIT_SEPARATOR = "\x1f"


@dataclass(frozen=True)
class CsvOptions:
    """How a delimited text file is laid out. Empty fields (and `null_values`) read as null.

    separator  one or more characters ("," "\\t" "|" "::"); a multi-byte one is rewritten to one byte
               (UNIT_SEPARATOR) per block before parsing, so it costs one `bytes.replace`
    encoding   any ASCII-compatible Python codec ("utf-8", "latin-1", "cp1252", ...); other encodings
               are transcoded to UTF-8 per block
    """

    separator: str = ","
    has_header: bool = True
    quote_char: str | None = '"'
    null_values: tuple[str, ...] = ()
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        if not isinstance(self.separator, str) or not self.separator or "\n" in self.separator:
            raise ValueError(f"CsvOptions: separator must be a non-empty string without a newline, got {self.separator!r}")
        if self.quote_char is not None and len(self.quote_char.encode()) != 1:
            raise ValueError(f"CsvOptions: quote_char must be one byte or None, got {self.quote_char!r}")
        object.__setattr__(self, "null_values", tuple(self.null_values))
        try:
            ascii_compatible = f"\n{self.separator}a0".encode(self.encoding) == f"\n{self.separator}a0".encode()
        except LookupError:
            raise ValueError(f"CsvOptions: unknown encoding {self.encoding!r}") from None
        except UnicodeEncodeError:
            ascii_compatible = False
        if not ascii_compatible:
            raise ValueError(
                f"CsvOptions: encoding {self.encoding!r} does not write the separator {self.separator!r} and newlines "
                "as UTF-8 does; give an ASCII-compatible encoding (utf-8, latin-1, cp1252, ...)"
            )

    @property
    def byte_separator(self) -> str:
        """The one-byte separator the parser sees (UNIT_SEPARATOR for a multi-byte one)."""
        return self.separator if len(self.separator.encode()) == 1 else UNIT_SEPARATOR

    @property
    def is_utf8(self) -> bool:
        return self.encoding.lower().replace("_", "-") in ("utf-8", "utf8")

    def to_parser_bytes(self, block: bytes) -> bytes:
        """A block of whole lines as the parser reads it: UTF-8, with a one-byte separator."""
        if not self.is_utf8:
            block = block.decode(self.encoding, errors="replace").encode()
        if self.byte_separator != self.separator:
            if UNIT_SEPARATOR.encode() in block:
                raise ValueError(
                    f"the data holds the byte 0x1f, which the multi-byte separator {self.separator!r} is rewritten to"
                )
            block = block.replace(self.separator.encode(), UNIT_SEPARATOR.encode())
        return block


@dataclass(frozen=True)
class Source:
    """What a worker needs to parse any partition of a dataset (small, picklable)."""

    format: Format
    schema: dict[str, pl.DataType]
    csv: CsvOptions
    block_bytes: int = DEFAULT_PARTITION_BYTES  # gzip text: decompressed bytes per chunk
    binary: tuple[str, ...] = ()  # columns whose values must be 0 or 1 (labels)


@dataclass(frozen=True)
class Partition:
    """`start`/`end`: byte range (text; end = -1 for a whole gzip file) or row-group range (Parquet)."""

    index: int
    source: Source
    path: str = ""
    start: int = 0
    end: int = -1
    frame: pl.DataFrame | None = field(default=None, compare=False)
    first_line: int | None = None  # 1-based line number of the first line, when known without a scan


@dataclass(frozen=True)
class Chunk:
    frame: pl.DataFrame
    partition: int
    row_offset: int  # rows of this partition before this chunk (after skipping bad rows)
    report: SkipReport


PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
TEXT_SUFFIXES = (".csv", ".tsv", ".txt")


def _in_directory(name: str, format: Format | None) -> bool:
    """Whether a file of a directory given as input is data: Parquet files for Parquet, text files for CSV
    (any name, gzip or not, when the format is given), never side files such as schema.json."""
    if name.startswith((".", "_")):
        return False
    base = name[:-3] if name.endswith(".gz") else name
    match format:
        case Format.PARQUET:
            return base.endswith(PARQUET_SUFFIXES)
        case Format.CSV:
            return not base.endswith((*PARQUET_SUFFIXES, ".json", ".crc"))
        case _:
            return base.endswith((*PARQUET_SUFFIXES, *TEXT_SUFFIXES))


def _expand_paths(paths: str | Path | Sequence[str | Path], format: Format | None) -> tuple[str, ...]:
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[str] = []
    for item in items:
        text = str(item)
        if os.path.isdir(text):
            found = sorted(os.path.join(text, f) for f in os.listdir(text) if _in_directory(f, format))
        elif any(ch in text for ch in "*?["):
            found = sorted(glob.glob(text))
        else:
            found = [text] if os.path.exists(text) else []
        if not found and os.path.isdir(text):
            raise FileNotFoundError(f"Dataset: {text!r} is a folder with no input files in it")
        if not found:
            raise FileNotFoundError(f"Dataset: no input files match {text!r}")
        out.extend(found)
    return tuple(out)


def _infer_format(path: str) -> Format:
    name = path[:-3] if path.endswith(".gz") else path
    if name.endswith(PARQUET_SUFFIXES):
        return Format.PARQUET
    if name.endswith(TEXT_SUFFIXES):
        return Format.CSV
    raise ValueError(f"Dataset: cannot tell the format of {path!r} from its suffix; pass format=")


class Dataset:
    """Raw input for a Workflow: files or in-memory frames, a schema, and how to cut partitions.

    schema: column -> Polars dtype; inferred when omitted (Parquet: from the first file; CSV with a
    header: from its first 10,000 rows). `partitioned_by` asserts that all rows sharing those
    columns' values lie in one file (needed by DifferenceLag and Groupby across partitions;
    `repartition` makes it true); each file is then one partition.
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path] = (),
        *,
        format: Format | str | None = None,
        schema: Mapping[str, pl.DataType | type[pl.DataType]] | None = None,
        csv: CsvOptions | None = None,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
        partitioned_by: Sequence[str] = (),
        frames: Sequence[pl.DataFrame] = (),
        binary: Sequence[str] = (),
    ) -> None:
        if partition_bytes <= 0:
            raise ValueError(f"Dataset: partition_bytes must be > 0, got {partition_bytes}")
        if bool(frames) == bool(paths):
            raise ValueError("Dataset: give either paths or frames")
        self.paths = _expand_paths(paths, None if format is None else Format(format)) if paths else ()
        self.frames = tuple(frames)
        self.partition_bytes = partition_bytes
        self.partitioned_by = tuple(partitioned_by)
        self.csv = csv or CsvOptions()
        if self.frames:
            self.format = Format.FRAME
        elif format is not None:
            self.format = Format(format)
        else:
            formats = {_infer_format(p) for p in self.paths}
            if len(formats) != 1:
                raise ValueError(f"Dataset: files of mixed formats {sorted(f.value for f in formats)}")
            self.format = formats.pop()
        self.schema: dict[str, pl.DataType] = (
            {name: dtype() if isinstance(dtype, type) else dtype for name, dtype in schema.items()}
            if schema is not None
            else self._infer_schema()
        )
        if not self.schema:
            raise ValueError("Dataset: empty schema")
        self.binary = tuple(binary)  # label columns: a value other than 0/1 is bad input, with its line
        unknown = [c for c in self.binary if c not in self.schema]
        if unknown:
            raise ValueError(f"Dataset: binary columns {unknown} are not in the schema {list(self.schema)}")

    @classmethod
    def from_frames(cls, *frames: pl.DataFrame, partitioned_by: Sequence[str] = ()) -> Dataset:
        return cls(frames=frames, partitioned_by=partitioned_by)

    @classmethod
    def criteo(
        cls,
        paths: str | Path | Sequence[str | Path],
        *,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
        partitioned_by: Sequence[str] = (),
    ) -> Dataset:
        """Criteo Display Advertising TSV: label, I1..I13 integers, C1..C26 hex strings; empty = null."""
        schema: dict[str, pl.DataType] = {"label": pl.Int64()}
        schema |= {c: pl.Int64() for c in CRITEO_DENSE}
        schema |= {c: pl.String() for c in CRITEO_SPARSE}
        options = CsvOptions(separator="\t", has_header=False, quote_char=None)
        return cls(
            paths,
            format=Format.CSV,
            schema=schema,
            csv=options,
            partition_bytes=partition_bytes,
            partitioned_by=partitioned_by,
            binary=("label",),
        )

    @property
    def source(self) -> Source:
        return Source(self.format, self.schema, self.csv, self.partition_bytes, self.binary)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.schema)

    def _infer_schema(self) -> dict[str, pl.DataType]:
        match self.format:
            case Format.FRAME:
                return dict(self.frames[0].schema)
            case Format.PARQUET:
                return dict(pl.read_parquet_schema(self.paths[0]))
            case Format.CSV:
                if not self.csv.has_header:
                    raise ValueError("Dataset: CSV without a header needs schema=")
                head = read_text_head(self.paths[0], 4 << 20)
                cut = head.rfind(b"\n") + 1 or len(head)
                sample = pl.read_csv(
                    io.BytesIO(self.csv.to_parser_bytes(head[:cut])),
                    separator=self.csv.byte_separator,
                    quote_char=self.csv.quote_char,
                    null_values=list(self.csv.null_values) or None,
                    infer_schema_length=10_000,
                )
                return dict(sample.schema)

    def partitions(self) -> list[Partition]:
        source = self.source
        out: list[Partition] = []
        match self.format:
            case Format.FRAME:
                for frame in self.frames:
                    out.append(Partition(len(out), source, frame=frame))
            case Format.PARQUET:
                for path in self.paths:
                    meta = pq.ParquetFile(path).metadata
                    if self.partitioned_by or meta.num_row_groups == 0:
                        out.append(Partition(len(out), source, path, 0, meta.num_row_groups))
                        continue
                    start, size = 0, 0
                    for rg in range(meta.num_row_groups):
                        size += meta.row_group(rg).total_byte_size
                        if size >= self.partition_bytes or rg == meta.num_row_groups - 1:
                            out.append(Partition(len(out), source, path, start, rg + 1))
                            start, size = rg + 1, 0
            case Format.CSV:
                for path in self.paths:
                    header_end = _header_end(path) if self.csv.has_header else 0
                    first_line = 2 if self.csv.has_header else 1
                    if path.endswith(".gz"):
                        out.append(Partition(len(out), source, path, header_end, -1, first_line=first_line))
                        continue
                    size = os.path.getsize(path)
                    if self.partitioned_by:
                        out.append(Partition(len(out), source, path, header_end, size, first_line=first_line))
                        continue
                    for start in range(header_end, size, self.partition_bytes):
                        end = min(start + self.partition_bytes, size)
                        out.append(
                            Partition(len(out), source, path, start, end, first_line=first_line if start == 0 else None)
                        )
                    if size <= header_end:
                        out.append(Partition(len(out), source, path, header_end, header_end, first_line=first_line))
        return out

    def fingerprint(self) -> list[str]:
        """Identifies the exact input (paths, sizes, mtimes, partitions) for out-of-fold checks."""
        if self.format is Format.FRAME:
            return [f"frame:{f.height}x{f.width}:{f.hash_rows(seed=0).sum()}" for f in self.frames]
        return [f"{p}:{os.path.getsize(p)}:{os.path.getmtime(p)}:{self.partition_bytes}" for p in self.paths]


# -- reading ------------------------------------------------------------------------------------------
def _open_text(path: str) -> gzip.GzipFile | io.BufferedReader:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


_GZIP_DAMAGE = (EOFError, gzip.BadGzipFile, zlib.error)  # a truncated or corrupt .gz, as the reads raise it


def _read_text(f: gzip.GzipFile | io.BufferedReader, size: int, path: str, offset: int = 0, line: int = 1) -> bytes:
    """Up to `size` bytes of text from `f` (fewer only at its end). A gzip stream that breaks off is a
    ValueError naming `path`, the byte of the text and the line where it does (`offset` and `line`: where
    this read starts). Reads go one gzip chunk at a time (read1), so the bytes before the break are
    counted, not lost in a half-filled buffer."""
    out = bytearray()
    while len(out) < size:
        try:
            part = f.read1(size - len(out))
        except _GZIP_DAMAGE as e:
            at, lines = offset + len(out), line + out.count(b"\n")
            raise ValueError(f"{path}: truncated or damaged gzip file: its text breaks off at byte {at:,} (line {lines:,}): {e}") from None
        if not part:
            break
        out += part
    return bytes(out)


def read_text_head(path: str, max_bytes: int) -> bytes:
    """The first `max_bytes` bytes of a text file, plain or gzip (see _read_text for a damaged one)."""
    with _open_text(path) as f:
        return _read_text(f, max_bytes, path)


def _first_line(path: str) -> bytes:
    """Line 1 of a text file (plain or gzip) with its newline."""
    with _open_text(path) as f:
        try:
            return f.readline()
        except _GZIP_DAMAGE as e:
            raise ValueError(f"{path}: truncated or damaged gzip file: its text breaks off in line 1: {e}") from None


def read_header(path: str, csv: CsvOptions) -> list[str]:
    """The column names on the first line of a delimited text file (plain or gzip)."""
    line = csv.to_parser_bytes(_first_line(path))
    if not line.strip():
        raise ValueError(f"{path}: no header line (the file is empty or starts with an empty line)")
    quote = csv.quote_char
    return pl.read_csv(io.BytesIO(line), separator=csv.byte_separator, quote_char=quote, n_rows=0).columns


def _header_end(path: str) -> int:
    return len(_first_line(path))


def _count_lines_before(path: str, offset: int) -> int:
    """Newlines in path[:offset] (only called to put a line number on an error)."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0:
            block = f.read(min(offset, 16 << 20))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def _read_range(path: str, start: int, end: int) -> tuple[int, bytes]:
    """(offset of the first line, the lines starting in [start, end)): skip the tail of a line begun
    before `start`, finish the last one."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            f.readline()  # ends exactly at `start` when byte start - 1 is a newline
            start = f.tell()
        if start >= end:
            return start, b""
        data = f.read(end - start)
        if data and not data.endswith(b"\n"):
            data += f.readline()
        return start, data


def _gzip_blocks(path: str, start: int, block_bytes: int, first_line: int = 1) -> Iterator[bytes]:
    """The text of a gzip file from byte `start` (line `first_line`) on, in blocks of whole lines of
    about `block_bytes`; a damaged stream is a ValueError naming the line where it breaks off."""
    with gzip.open(path, "rb") as f:
        try:
            f.seek(start)
        except _GZIP_DAMAGE as e:
            raise ValueError(f"{path}: truncated or damaged gzip file: its text breaks off before byte {start:,}: {e}") from None
        rest = b""
        offset, line = start, first_line  # where the next read starts, to place a damaged stream in the file
        while True:
            data = _read_text(f, block_bytes, path, offset, line)
            offset += len(data)
            line += data.count(b"\n")
            if not data:
                if rest:
                    yield rest
                return
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            yield data[:cut]


def first_line(partition: Partition) -> int | None:
    """1-based line number of a text partition's first line (a scan of the bytes before it when not
    known already); None for Parquet and frames."""
    if partition.source.format is not Format.CSV:
        return None
    return _LineNumbers(partition).first()


class _LineNumbers:
    """1-based line number of a block's first line, computed (by a scan) only when an error needs it."""

    def __init__(self, partition: Partition) -> None:
        self.path = partition.path
        self.known = partition.first_line
        self.offset = partition.start  # byte offset of the first line, once known

    def first(self) -> int:
        if self.known is None:
            self.known = _count_lines_before(self.path, self.offset) + 1
        return self.known


_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
TEXT_ID_FIX = 'declare the column type = "string": ids too long for a 64-bit integer are read as text'


@dataclass(frozen=True)
class CastError:
    """The first cell of a block that does not convert to its column's declared type."""

    column: str
    row: int  # 0-based in the block
    value: str
    reason: str
    fix: str | None  # set where the column's type is what is wrong (an id beyond int64), not the row


def cast_fix(value: str, dtype: pl.DataType) -> str | None:
    """TEXT_ID_FIX where `value` is an integer too long for the integer `dtype` (no row of such a
    column would convert, so skipping bad rows is not the remedy); None otherwise."""
    return TEXT_ID_FIX if dtype.is_integer() and _INTEGER.fullmatch(value) is not None else None


def _cast_errors(raw: pl.DataFrame, schema: dict[str, pl.DataType]) -> tuple[pl.DataFrame, np.ndarray, CastError | None]:
    """Cast columns to the schema without failing: (cast frame, [R] bool bad-row mask, first error or None)."""
    bad = np.zeros(raw.height, dtype=bool)
    first: CastError | None = None
    columns = []
    for name, dtype in schema.items():
        col = raw[name]
        cast = col.cast(dtype, strict=False)
        failed = (cast.is_null() & col.is_not_null()).to_numpy()
        if failed.any():
            row = int(np.argmax(failed))
            if first is None or row < first.row:
                value = str(col[row])
                fix = cast_fix(value, dtype)
                reason = f"integer out of the range of {dtype}" if fix else f"cannot convert {col.dtype} value to {dtype}"
                first = CastError(name, row, value, reason, fix)
            bad |= failed
        columns.append(cast)
    return pl.DataFrame(columns), bad, first


def _parse_text(
    block: bytes, partition: Partition, lines: _LineNumbers, on_error: OnError
) -> tuple[pl.DataFrame, SkipReport]:
    from hugerec.data.preprocess.textscan import keep_lines, scan_lines  # Numba: only when text is parsed

    source = partition.source
    names = list(source.schema)
    buf = np.frombuffer(block, dtype=np.uint8)
    quote = ord(source.csv.quote_char) if source.csv.quote_char else 0
    starts, counts = scan_lines(buf, ord(source.csv.byte_separator), quote)
    line_index = np.arange(counts.shape[0])  # [R] line of each parsed row, relative to the block
    examples: list[RowError] = []
    invalid = _invalid_utf8_lines(block, starts)  # [R] polars cannot read such lines even as text
    wrong = (counts != len(names)) | invalid

    def reason(i: int) -> str:
        return (
            "invalid UTF-8"
            if invalid[i]
            else f"{counts[i]} fields, expected {len(names)} ({', '.join(names[:3])}, ...)"
        )

    if wrong.any():
        first = int(np.argmax(wrong))
        error = RowError(partition.path, reason(first), line=lines.first() + first)
        if on_error is OnError.RAISE:
            if first:  # a bad value on an earlier line is the first error: parse up to this line
                _parse_text(block[: starts[first]], partition, lines, on_error)
            raise BadInputError(error)
        for i in np.flatnonzero(wrong)[:MAX_EXAMPLES]:
            examples.append(RowError(partition.path, reason(int(i)), line=lines.first() + int(i)))
        buf = keep_lines(buf, starts, ~wrong)
        line_index = line_index[~wrong]
    skipped = int(wrong.sum())
    data = buf.tobytes() if skipped else block
    options = {
        "has_header": False,
        "separator": source.csv.byte_separator,
        "quote_char": source.csv.quote_char,
        "null_values": list(source.csv.null_values) or None,
        "raise_if_empty": False,
    }
    if buf.shape[0] == 0:
        return pl.DataFrame(schema=source.schema), SkipReport(counts.shape[0], skipped, tuple(examples))
    try:
        frame = pl.read_csv(data, schema=source.schema, **options)  # type: ignore[arg-type]  # options typed above
    except pl.exceptions.ComputeError:
        # slow path, only for blocks with bad values: read text, cast, and find the bad cells
        raw = pl.read_csv(data, schema=dict.fromkeys(names, pl.String()), **options)  # type: ignore[arg-type]  # options typed above
        frame, bad, first_error = _cast_errors(raw, source.schema)
        if first_error is None:
            raise
        if on_error is OnError.RAISE:
            line = lines.first() + int(line_index[first_error.row])
            raise BadInputError(
                RowError(
                    partition.path,
                    first_error.reason,
                    line=line,
                    column=first_error.column,
                    value=first_error.value,
                    fix=first_error.fix,
                )
            ) from None
        for r in np.flatnonzero(bad)[: MAX_EXAMPLES - len(examples)]:
            col = next(n for n in names if raw[n][int(r)] is not None and frame[n][int(r)] is None)
            line = lines.first() + int(line_index[r])
            value = str(raw[col][int(r)])
            fix = cast_fix(value, source.schema[col])
            examples.append(RowError(partition.path, "cannot convert", line=line, column=col, value=value, fix=fix))
        frame = frame.filter(pl.Series(~bad))
        line_index = line_index[~bad]
        skipped += int(bad.sum())
    frame, labels = _check_binary(
        frame, partition, on_error, lambda r: RowError(partition.path, "", line=lines.first() + int(line_index[r]))
    )
    return frame, SkipReport(counts.shape[0], skipped, tuple(examples)).merge(labels)


def _invalid_utf8_lines(block: bytes, starts: np.ndarray) -> np.ndarray:
    """[R] bool: the lines of `block` (bounded by the [R + 1] `starts`) that are not valid UTF-8.

    ASCII and valid UTF-8 blocks (every well-formed file) cost one C-speed check; only a block that
    fails it is decoded line by line, to name the bad lines.
    """
    none = np.zeros(starts.shape[0] - 1, dtype=bool)
    if block.isascii():
        return none
    try:
        block.decode("utf-8")
        return none
    except UnicodeDecodeError:
        pass
    for i, (a, b) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)):
        try:
            block[a:b].decode("utf-8")
        except UnicodeDecodeError:
            none[i] = True
    return none


def _check_binary(
    frame: pl.DataFrame, partition: Partition, on_error: OnError, where: Callable[[int], RowError]
) -> tuple[pl.DataFrame, SkipReport]:
    """Rows whose label columns (`Source.binary`) hold anything but 0 or 1 (null is left to the ops).

    `where(r)` locates row r of `frame` in its file (the line for text, the row for Parquet).
    """
    bad = np.zeros(frame.height, dtype=bool)
    errors: list[RowError] = []
    for column in partition.source.binary:
        values = frame[column]
        wrong = ((values != 0) & (values != 1)).fill_null(False).to_numpy()  # ints or floats
        for r in np.flatnonzero(wrong & ~bad)[: MAX_EXAMPLES - len(errors)]:
            at = where(int(r))
            errors.append(
                dataclasses.replace(at, reason="a label must be 0 or 1", column=column, value=str(values[int(r)]))
            )
        bad |= wrong
    if not bad.any():
        return frame, SkipReport()
    if on_error is OnError.RAISE:
        first = min(errors, key=lambda e: (e.line or 0, e.row or 0))
        raise BadInputError(first)
    return frame.filter(pl.Series(~bad)), SkipReport(0, int(bad.sum()), tuple(errors))


def _conform(
    frame: pl.DataFrame, partition: Partition, on_error: OnError, row_group: int | None
) -> tuple[pl.DataFrame, SkipReport]:
    """Select and cast a Parquet row group or an in-memory frame to the schema, locating bad cells."""
    schema = partition.source.schema
    missing = [c for c in schema if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{partition.path or '<frame>'}: columns {missing} of the schema are missing (has {frame.columns})"
        )
    frame = frame.select(list(schema))
    rows = np.arange(frame.height)  # [R] row of each kept row in the row group / frame
    report = SkipReport(frame.height)
    if any(frame.schema[c] != d for c, d in schema.items()):
        cast, bad, first_error = _cast_errors(frame, schema)
        frame = cast
        if first_error is not None:
            error = RowError(
                partition.path,
                first_error.reason,
                row_group=row_group,
                row=first_error.row,
                column=first_error.column,
                value=first_error.value,
                fix=first_error.fix,
            )
            if on_error is OnError.RAISE:
                raise BadInputError(error)
            frame, rows = frame.filter(pl.Series(~bad)), rows[~bad]
            report = SkipReport(report.rows_read, int(bad.sum()), (error,))
    frame, labels = _check_binary(
        frame, partition, on_error, lambda r: RowError(partition.path, "", row_group=row_group, row=int(rows[r]))
    )
    return frame, report.merge(labels)


def read_chunks(partition: Partition, on_error: OnError, block_bytes: int | None = None) -> Iterator[Chunk]:
    """The partition's rows as schema-typed chunks of bounded size (gzip: `block_bytes` decompressed
    bytes per chunk, default the dataset's partition_bytes)."""
    source = partition.source
    offset = 0
    match source.format:
        case Format.FRAME:
            assert partition.frame is not None
            frame, report = _conform(partition.frame, partition, on_error, None)
            yield Chunk(frame, partition.index, 0, report)
        case Format.PARQUET:
            file = pq.ParquetFile(partition.path)
            for rg in range(partition.start, partition.end):
                table = file.read_row_group(rg, columns=[c for c in source.schema if c in file.schema_arrow.names])
                frame, report = _conform(pl.DataFrame(pl.from_arrow(table)), partition, on_error, rg)
                yield Chunk(frame, partition.index, offset, report)
                offset += frame.height
        case Format.CSV:
            lines = _LineNumbers(partition)
            if partition.end >= 0:
                lines.offset, block = _read_range(partition.path, partition.start, partition.end)
                blocks: Iterator[bytes] = iter([block])
            else:
                blocks = _gzip_blocks(
                    partition.path, partition.start, block_bytes or source.block_bytes, partition.first_line or 1
                )
            for block in blocks:
                try:
                    parsed = source.csv.to_parser_bytes(block)
                except ValueError as e:
                    raise ValueError(f"{partition.path}: {e}") from None
                frame, report = _parse_text(parsed, partition, lines, on_error)
                yield Chunk(frame, partition.index, offset, report)
                offset += frame.height
                if lines.known is not None:
                    lines.known += block.count(b"\n")


def read_partition(partition: Partition, on_error: OnError) -> tuple[pl.DataFrame, SkipReport]:
    """The whole partition as one frame (for ops that need every row of a group together)."""
    frames, report = [], SkipReport()
    for chunk in read_chunks(partition, on_error):
        frames.append(chunk.frame)
        report = report.merge(chunk.report)
    return pl.concat(frames) if frames else pl.DataFrame(schema=partition.source.schema), report
