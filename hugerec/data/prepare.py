"""prepare: raw files described by an InputSpec -> split -> Workflow fitted on the training part only ->
trainable train / eval (/ test) Parquet shards, their schema.json and the fitted workflow.

    report = prepare(spec, "clicks.csv.gz", "data/", SplitSpec(SplitKind.TIME, last_days=7))

Layout of `out`: train/, eval/, test/ (with test files), schema.json (the shards' columns, kinds and
cardinalities: what `hugerec train` reads), workflow/ (the fitted workflow: what serving and
evaluation on raw files run new rows through).

The split is made on the raw rows before anything is fitted, so no statistic (vocabulary, mean,
target encoding) sees evaluation rows:

    random          each row goes to eval with probability eval_fraction (seeded, streaming)
    time            rows at or after a cutoff go to eval: a date ("2014-04-01", "2014-04-01 12:00:00",
                    UTC) or epoch seconds; or the rows of the last `last_days` days, (latest - N days,
                    latest]; or, with neither, the latest eval_fraction of the rows; rows without a time
                    stay in train
    leave_last_out  each user's last `holdout` rows by time go to eval (users with no more than
                    `holdout` rows stay in train); reads the user and time columns into memory
    files           the given eval (and test) files, each read as the input is

test_split = True holds out a test part from the same input, by the same rule applied once more,
later in time than eval: random gives each row to test with probability eval_fraction too; time
makes the last `last_days` days (or the latest eval_fraction of the rows) test and the same span
before them eval; leave_last_out makes each user's last `holdout` rows test and the `holdout`
before them eval (users with more than 2 * holdout rows; the others stay in train).

Except with given files, the input is first staged as typed Parquet (bad rows raised or skipped
there, with their file and line), then split.
"""

from __future__ import annotations

import datetime
import enum
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from hugerec.data.input_spec import (
    ColumnType,
    InputFormat,
    InputSpec,
    Role,
    default_ops,
    model_schema,
    output_columns,
)
from hugerec.data.preprocess.dataset import Dataset, Format, Partition, first_line, read_chunks, read_header
from hugerec.data.preprocess.errors import MAX_EXAMPLES, BadInputError, OnError, RowError, SkipReport
from hugerec.data.preprocess.op import Op
from hugerec.data.preprocess.temporal import ParseTime
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.shards import ShardWriter, expand_paths, iter_row_groups


class SplitKind(enum.Enum):
    RANDOM = "random"
    TIME = "time"
    LEAVE_LAST_OUT = "leave_last_out"
    FILES = "files"


@dataclass(frozen=True)
class SplitSpec:
    """How rows are held out for evaluation (see the module docstring). time_column / user_column
    default to the input's columns with role timestamp / user."""

    kind: SplitKind = SplitKind.RANDOM
    eval_fraction: float = 0.1
    seed: int = 0
    cutoff: str | int | None = None
    last_days: float | None = None
    holdout: int = 1
    time_column: str | None = None
    user_column: str | None = None
    test_split: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SplitKind(self.kind))
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.test_split:
            by_fraction = self.kind is SplitKind.RANDOM or (
                self.kind is SplitKind.TIME and self.cutoff is None and self.last_days is None
            )
            if self.kind is SplitKind.FILES:
                raise ValueError('test_split: split = "files" takes the test rows from test_input')
            if self.kind is SplitKind.TIME and self.cutoff is not None:
                raise ValueError("test_split: one time_cutoff cannot cut twice; use last_days or eval_fraction")
            if by_fraction and not 0.0 < self.eval_fraction < 0.5:
                raise ValueError(
                    f"test_split: eval and test take eval_fraction each, which must be in (0, 0.5), got {self.eval_fraction}"
                )
        if self.holdout < 1:
            raise ValueError(f"holdout must be >= 1, got {self.holdout}")
        if self.last_days is not None and self.last_days <= 0:
            raise ValueError(f"last_days must be > 0, got {self.last_days}")
        if self.kind is SplitKind.TIME and self.cutoff is not None and self.last_days is not None:
            raise ValueError('split = "time" takes one of time_cutoff (a date or epoch seconds) and last_days, not both')
        if self.cutoff is not None:
            cutoff_seconds(self.cutoff)  # its own check, now


def cutoff_seconds(cutoff: str | int) -> int:
    """A cutoff as epoch seconds: an int is one already; a string is an ISO date or date-time (UTC)."""
    if isinstance(cutoff, int):
        return cutoff
    text = str(cutoff).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"time_cutoff {cutoff!r} is neither epoch seconds nor a date like 2014-04-01 or 2014-04-01 12:00:00"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp())


def time_cutoff(split: SplitSpec, seconds: np.ndarray, spans: int = 1) -> int:
    """A time split's first held-out second: time_cutoff; or latest - last_days (the rows of the last N
    days, (latest - N days, latest]); or, with neither, the time that leaves the latest eval_fraction of
    the rows (the (1 - eval_fraction) quantile, rounded up to a row's time) for eval. spans = 2: the
    start of twice that span (last 2N days, latest 2 * eval_fraction), where test_split's eval begins."""
    if split.cutoff is not None:
        return cutoff_seconds(split.cutoff)
    if not len(seconds):
        raise ValueError('preprocess.split: split = "time" finds no times to split (the time column is empty)')
    if split.last_days is not None:
        return int(seconds.max()) - int(spans * split.last_days * 86400) + 1
    return int(np.quantile(seconds, 1.0 - spans * split.eval_fraction, method="higher"))


@dataclass(frozen=True)
class PrepareReport:
    train_rows: int
    eval_rows: int
    test_rows: int
    schema: Path
    workflow: Path
    skipped: SkipReport = field(default_factory=SkipReport)  # bad rows skipped (on_error = "skip")


@dataclass(frozen=True)
class Join:
    """A side table (user or item features) joined to every input row by the column `on`, which both
    hold: a left join, so rows without a match keep their place with nulls in the side columns. Each
    `on` value may appear once in the side table; its type must equal the input's (no silent misses)."""

    spec: InputSpec
    paths: str | Sequence[str]
    on: str

    def __post_init__(self) -> None:
        if self.on not in [c.name for c in self.spec.columns]:
            raise ValueError(f"on = {self.on!r} is not one of its columns {[c.name for c in self.spec.columns]}")

    def table(self, where: str) -> pl.DataFrame:
        """The whole side table, its rows checked as the input's are (bad rows raise, naming file and line)."""
        data = self.spec.dataset(self.paths, where)
        frames = [chunk.frame for part in data.partitions() for chunk in read_chunks(part, OnError.RAISE)]
        frame = pl.concat(frames) if frames else pl.DataFrame(schema=data.schema)
        keep = [c.name for c in self.spec.columns if c.role is not Role.NONE or c.name == self.on]
        frame = frame.select(keep)
        repeated = frame.filter(pl.col(self.on).is_duplicated())
        if repeated.height:
            raise ValueError(f"{where}: {self.on} = {repeated[self.on][0]!r} appears more than once in {self.paths!r}")
        return frame


def with_joins(spec: InputSpec, joins: Sequence[Join]) -> InputSpec:
    """The input's columns followed by each side table's (its `on` column once): what the workflow sees."""
    columns = list(spec.columns)
    for join in joins:
        for c in join.spec.columns:
            if c.name == join.on or c.role is Role.NONE:
                continue
            if any(c.name == have.name for have in columns):
                raise ValueError(f"join on {join.on!r}: column {c.name!r} is already a column of the input or another join")
            columns.append(c)
    return replace(spec, columns=tuple(columns))


def prepare(
    spec: InputSpec,
    paths: str | Sequence[str],
    out: str | Path,
    *,
    split: SplitSpec | None = None,
    ops: Sequence[Op] | None = None,
    eval_paths: str | Sequence[str] | None = None,
    test_paths: str | Sequence[str] | None = None,
    joins: Sequence[Join] = (),
    on_error: OnError | str = OnError.RAISE,
    log_dense: bool = False,
    min_frequency: int = 1,
    max_vocab: int | None = None,
    eval_header: bool | None = None,
    test_header: bool | None = None,
) -> PrepareReport:
    """Stage (parse, join), split, fit on train, transform every part. ops: the workflow after the spec's
    input ops (None: `default_ops`). eval_header / test_header: whether the eval / test files start with a
    header line (None: as spec.header says for the input). Errors name where they came from
    (`preprocess.input`, ...)."""
    split = split or SplitSpec()
    mode = OnError(on_error)
    root = Path(out)
    staging = root / "_raw"
    shutil.rmtree(staging, ignore_errors=True)
    if split.kind is SplitKind.FILES and eval_paths is None:
        raise ValueError('preprocess.eval_input: split = "files" needs the evaluation files')
    if split.test_split and test_paths is not None:
        raise ValueError("preprocess.test_split: the test rows come from test_input; give one of the two")
    if split.kind is not SplitKind.FILES and eval_paths is not None:
        raise ValueError(
            f'preprocess.eval_input: given, but split = "{split.kind.value}" makes the eval set; '
            'use split = "files" for given evaluation files'
        )
    full = with_joins(spec, joins)
    tables = [(j.on, j.table(f"preprocess.join[{i}].input")) for i, j in enumerate(joins)]
    report = _stage(spec.dataset(paths, "preprocess.input"), spec, staging / "all", mode, tables, "preprocess.input")
    if eval_paths is not None:
        eval_data = _with_header(spec, eval_header).dataset(eval_paths, "preprocess.eval_input")
        report = report.merge(_stage(eval_data, spec, staging / "eval", mode, tables, "preprocess.eval_input"))
        train_dir = staging / "all"
    else:
        _split(full, split, staging / "all", staging / "train", staging / "eval", staging / "test")
        train_dir = staging / "train"
    train_ds = Dataset(str(train_dir), format=Format.PARQUET)
    chosen = list(ops) if ops is not None else default_ops(
        full, log_dense=log_dense, min_frequency=min_frequency, max_vocab=max_vocab
    )
    workflow = Workflow([*full.input_ops(train_ds.schema), *chosen], output_columns=output_columns(full, chosen))
    workflow.fit_transform(train_ds, root / "train", on_error=mode, overwrite=True)
    workflow.transform(Dataset(str(staging / "eval"), format=Format.PARQUET), root / "eval", overwrite=True)
    test_rows = 0
    shutil.rmtree(root / "test", ignore_errors=True)
    if test_paths is not None:
        test_data = _with_header(spec, test_header).dataset(test_paths, "preprocess.test_input")
        report = report.merge(_stage(test_data, spec, staging / "test", mode, tables, "preprocess.test_input"))
    if test_paths is not None or split.test_split:
        test_rows = workflow.transform(Dataset(str(staging / "test"), format=Format.PARQUET), root / "test").rows
    if spec.format is InputFormat.CSV:  # serving requests read "" and the null markers as missing, as the files did
        workflow.text_nulls = ("", *spec.null_values)
    schema = model_schema(full, workflow)
    schema.save(root / "schema.json")
    shutil.rmtree(root / "workflow", ignore_errors=True)
    workflow.save(root / "workflow")
    shutil.rmtree(staging, ignore_errors=True)
    return PrepareReport(_rows(root / "train"), _rows(root / "eval"), test_rows, root / "schema.json", root / "workflow", report)


def _with_header(spec: InputSpec, header: bool | None) -> InputSpec:
    return spec if header is None else replace(spec, header=header)


def lacks_labels(spec: InputSpec, paths: str | Sequence[str]) -> bool:
    """Whether the raw files at `paths` are unlabelled traffic: the input's columns without its label
    columns. Told from the first file: a header (or Parquet schema) naming none of the labels, or a
    headerless first line with exactly as many fields as the declared columns less the labels."""
    labels = spec.labels
    if not labels:
        return False
    if spec.format is InputFormat.PARQUET:
        first = Dataset(paths, format=Format.PARQUET, schema={"_": pl.Null()}).paths[0]
        return not any(n in pq.read_schema(first).names for n in labels)
    csv = spec.csv_options()
    first = Dataset(paths, format=Format.CSV, schema={"_": pl.String()}, csv=csv).paths[0]
    try:
        fields = read_header(first, csv)  # the first line's fields, a header or a row
    except ValueError:
        return False  # an empty file: reading it as declared names the problem
    if spec.header:
        return not any(n in fields for n in labels)
    return len(fields) == len(spec.columns) - len(labels)


def transform_raw(
    spec: InputSpec,
    paths: str | Sequence[str],
    workflow: Workflow,
    out: str | Path,
    where: str,
    on_error: OnError | str = OnError.RAISE,
    joins: Sequence[Join] = (),
    *,
    labelled: bool = True,
) -> SkipReport:
    """Raw files (read and joined as the training input was) through a fitted workflow into shards at
    `out`; a column read with another type than at fit time is an error naming it (Workflow.check_dtypes).
    labelled = False: the files lack the label columns (traffic to score, `lacks_labels`); the shards get
    them as 0, which only keeps the loader's layout: the caller must not report them."""
    staged = Path(f"{out}_raw")
    shutil.rmtree(staged, ignore_errors=True)
    tables = [(j.on, j.table(f"preprocess.join[{i}].input")) for i, j in enumerate(joins)]
    read = spec if labelled else replace(spec, columns=tuple(c for c in spec.columns if c.role is not Role.LABEL))
    fill = {} if labelled else {c.name: c.polars_dtype() for c in spec.columns if c.role is Role.LABEL}
    report = _stage(read.dataset(paths, where), read, staged, OnError(on_error), tables, where, fill)
    data = Dataset(str(staged), format=Format.PARQUET)
    workflow.check_dtypes(data.schema, where)
    shutil.rmtree(out, ignore_errors=True)
    workflow.transform(data, out, overwrite=True)
    shutil.rmtree(staged, ignore_errors=True)
    return report


def read_rows(
    spec: InputSpec, paths: str | Sequence[str], where: str, on_error: OnError | str = OnError.RAISE
) -> tuple[pl.DataFrame, SkipReport]:
    """Every row of the declared input, in memory: the declared columns, each timestamp parsed to Int64
    epoch seconds by its column's format; bad rows raised (file, line, column, value) or skipped and
    counted, as `prepare` stages them. What the retrieval and sequential views read (hugerec.data.events)."""
    mode = OnError(on_error)
    data = spec.dataset(paths, where)
    names = [c.name for c in spec.columns]
    frames: list[pl.DataFrame] = []
    report = SkipReport()
    for partition in data.partitions():
        exact = True  # line numbers are exact while no row of the partition was dropped
        for chunk in read_chunks(partition, mode):
            exact = exact and chunk.report.rows_skipped == 0
            at = (partition, chunk.row_offset) if exact else None
            frame, times = _check_times(chunk.frame, spec, partition.path, at, mode)
            report = report.merge(chunk.report).merge(times)
            exact = exact and times.rows_skipped == 0
            frames.append(frame.select(names))
    frame = pl.concat(frames) if frames else pl.DataFrame(schema={n: data.schema[n] for n in names})
    parsed = [
        _seconds(spec, c.name, frame.schema[c.name]).alias(c.name) for c in spec.columns if c.type is ColumnType.TIMESTAMP
    ]
    return (frame.with_columns(parsed) if parsed else frame), report


def _rows(folder: Path) -> int:
    return sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))


def _stage(
    data: Dataset,
    spec: InputSpec,
    out: Path,
    on_error: OnError,
    tables: Sequence[tuple[str, pl.DataFrame]],
    where: str,
    fill: Mapping[str, pl.DataType] | None = None,
) -> SkipReport:
    """The input as typed Parquet: every row parsed once, timestamps checked against their format (bad
    rows raised or skipped with their file and line), each side table left-joined on its column, and
    the columns of `fill` (absent from the files) added as zeros of their type."""
    report = SkipReport()
    shutil.rmtree(out, ignore_errors=True)
    for on, table in tables:
        if on not in data.schema:
            raise ValueError(f"join on {on!r}: the input has no column {on!r} ({list(data.schema)})")
        if data.schema[on] != table.schema[on]:
            raise ValueError(
                f"join on {on!r}: the input reads it as {data.schema[on]}, the side table as {table.schema[on]}; "
                "declare the same type in both (rows would find no match)"
            )
    with ShardWriter(out) as writer:
        for partition in data.partitions():
            exact = True  # line numbers are exact while no row of the partition was dropped
            for chunk in read_chunks(partition, on_error):
                exact = exact and chunk.report.rows_skipped == 0
                at = (partition, chunk.row_offset) if exact else None
                frame, times = _check_times(chunk.frame, spec, partition.path, at, on_error)
                report = report.merge(chunk.report).merge(times)
                exact = exact and times.rows_skipped == 0
                for on, table in tables:
                    frame = frame.join(table, on=on, how="left", maintain_order="left")
                if fill:
                    frame = frame.with_columns(pl.lit(0, dtype).alias(name) for name, dtype in fill.items())
                if frame.height:
                    writer.write(frame.to_arrow())
    if writer.num_rows == 0:
        given = data.paths[0] if len(data.paths) == 1 else list(data.paths)
        what = "no rows to learn from" if where == "preprocess.input" else "no rows"
        skipped = ""
        if report.examples:  # every row skipped as bad input: say why, and the remedy where it is known
            first = report.examples[0]
            skipped = f"; all skipped as bad input, first at {first}" + (f"; {first.fix}" if first.fix else "")
        raise ValueError(f"{where}: {what} in {given!r} ({report.rows_read} read{skipped})")
    return report


def _check_times(
    frame: pl.DataFrame, spec: InputSpec, path: str, where: tuple[Partition, int] | None, on_error: OnError
) -> tuple[pl.DataFrame, SkipReport]:
    """Rows whose timestamp does not match its column's format: raised (file, line, column, value) or
    dropped and counted, here where the file and line are known, not later in the workflow's ParseTime."""
    bad = np.zeros(frame.height, dtype=bool)
    errors: list[RowError] = []
    for c in spec.columns:
        if c.type is not ColumnType.TIMESTAMP or c.name not in frame.columns:
            continue
        parsed = frame.select(ParseTime((c.name,), c.format).expression(c.name, frame.schema[c.name])).to_series()
        failed = (parsed.is_null() & frame[c.name].is_not_null()).to_numpy()
        for r in np.flatnonzero(failed & ~bad)[: MAX_EXAMPLES - len(errors)]:
            start = first_line(where[0]) if where is not None else None  # where = (partition, rows before the chunk)
            line = None if start is None or where is None else start + where[1] + int(r)
            reason = f"does not match the time format {c.format!r}"
            errors.append(RowError(path, reason, line=line, column=c.name, value=str(frame[c.name][int(r)])))
        bad |= failed
    if not bad.any():
        return frame, SkipReport()
    if on_error is OnError.RAISE:
        raise BadInputError(min(errors, key=lambda e: e.line or 0))
    return frame.filter(pl.Series(~bad)), SkipReport(0, int(bad.sum()), tuple(errors))


def _column(spec: InputSpec, given: str | None, role: Role, key: str, kind: SplitKind) -> str:
    if given is not None:
        return given
    found = spec.names_with_role(role)
    if len(found) != 1:
        raise ValueError(
            f'preprocess.{key}: split = "{kind.value}" needs the {role.value} column; '
            f"{'none has' if not found else f'{list(found)} have'} role = \"{role.value}\" (or set preprocess.{key})"
        )
    return found[0]


def _seconds(spec: InputSpec, column: str, dtype: pl.DataType) -> pl.Expr:
    try:
        fmt = spec.column(column).format
    except KeyError:
        fmt = "unix"
    return ParseTime((column,), fmt).expression(column, dtype)


TRAIN, EVAL, TEST = 0, 1, 2  # the part a row goes to


def _split(spec: InputSpec, split: SplitSpec, src: Path, train: Path, eval_: Path, test: Path) -> None:
    """Rows of the staged `src` -> train / eval (/ test, with split.test_split) shards, by `split.kind`
    (see the module docstring)."""
    files = expand_paths(src)
    scan = pl.scan_parquet([str(f) for f in files])
    names = scan.collect_schema()
    part: np.ndarray | None = None  # [N] int8 over all rows in file order, when computed before writing
    match split.kind:
        case SplitKind.TIME:
            column = _column(spec, split.time_column, Role.TIMESTAMP, "time_column", split.kind)
            _require(column, names, "time_column")
            seconds = scan.select(_seconds(spec, column, names[column]).alias("t")).collect()["t"]
            known = seconds.drop_nulls().to_numpy()
            later = seconds >= time_cutoff(split, known)
            part = np.where(later.fill_null(False).to_numpy(), EVAL, TRAIN).astype(np.int8)
            if split.test_split:  # the latest span is test, the span before it eval
                earlier = (seconds >= time_cutoff(split, known, spans=2)).fill_null(False).to_numpy()
                part = np.where(part == EVAL, TEST, np.where(earlier, EVAL, TRAIN)).astype(np.int8)
        case SplitKind.LEAVE_LAST_OUT:
            user = _column(spec, split.user_column, Role.USER, "user_column", split.kind)
            column = _column(spec, split.time_column, Role.TIMESTAMP, "time_column", split.kind)
            _require(user, names, "user_column")
            _require(column, names, "time_column")
            frame = scan.select(pl.col(user), _seconds(spec, column, names[column]).alias("t")).with_row_index("row")
            part = np.zeros(scan.select(pl.len()).collect().item(), dtype=np.int8)
            if split.test_split:  # the last `holdout` rows of users with more than twice that: test; those before: eval
                last = _last_rows(frame.collect(), user, 2 * split.holdout, min_rows=2 * split.holdout)
                part[last[:, : split.holdout].ravel()] = EVAL
                part[last[:, split.holdout :].ravel()] = TEST
            else:
                part[_last_rows(frame.collect(), user, split.holdout).ravel()] = EVAL
        case SplitKind.RANDOM | SplitKind.FILES:
            pass
    for d in (train, eval_, test):
        shutil.rmtree(d, ignore_errors=True)
    offset = 0
    with ShardWriter(train) as train_writer, ShardWriter(eval_) as eval_writer, ShardWriter(test) as test_writer:
        for k, table in enumerate(iter_row_groups(files)):
            if part is None:  # random: [0, f) eval, [f, 2f) test (with test_split), the rest train
                draw = np.random.default_rng([split.seed, k]).random(table.num_rows)
                rows = np.where(draw < split.eval_fraction, EVAL, TRAIN)
                if split.test_split:
                    rows[(draw >= split.eval_fraction) & (draw < 2 * split.eval_fraction)] = TEST
            else:
                rows = part[offset : offset + table.num_rows]
            offset += table.num_rows
            train_writer.write(table.filter(pa.array(rows == TRAIN)))
            eval_writer.write(table.filter(pa.array(rows == EVAL)))
            if split.test_split:
                test_writer.write(table.filter(pa.array(rows == TEST)))
    parts = [("train", train_writer), ("eval", eval_writer)] + ([("test", test_writer)] if split.test_split else [])
    for name, writer in parts:
        if writer.num_rows == 0:
            raise ValueError(f'preprocess.split: split = "{split.kind.value}" leaves no rows for {name} (check its settings)')


def _require(column: str, names: pl.Schema, key: str) -> None:
    if column not in names:
        raise ValueError(f"preprocess.{key}: {column!r} is not a column of the input ({list(names)})")


def _last_rows(frame: pl.DataFrame, user: str, holdout: int, min_rows: int | None = None) -> np.ndarray:
    """[U, holdout] row numbers of each user's last `holdout` rows by time (ties: the later row), oldest
    first, for the U users with more than `min_rows` (default: holdout) rows."""
    picked = (
        frame.sort(["t", "row"], nulls_last=False)
        .group_by(user, maintain_order=True)
        .agg(pl.col("row").tail(holdout).alias("rows"), pl.len().alias("n"))
        .filter(pl.col("n") > (holdout if min_rows is None else min_rows))
    )
    return picked["rows"].explode().to_numpy().astype(np.int64).reshape(-1, holdout)  # [U * holdout] -> [U, holdout]
