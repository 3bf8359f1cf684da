"""Workflow: a list of ops fitted over a whole dataset (map-reduce), then applied per partition,
to single serving requests, and saved to disk as JSON + Parquet.

    wf = Workflow([FillMissing(dense), LogOp(dense), Normalize(dense), Categorify(sparse, freq_threshold=3)])
    wf.fit(Dataset.criteo("day_0.tsv.gz"))             # statistics over every row, never all in memory
    wf.transform(Dataset.criteo("day_1.tsv.gz"), "out/") # -> out/part-00000.parquet, ...
    wf.save("wf/");  Workflow.load("wf/").transform_request({"I1": 3, "C1": "68fd1e64", ...})

Ops run in list order, each on the previous one's output. Fitting needs as many passes over the data
as the longest chain of stateful ops that read each other's outputs (FillMissing(MEAN) -> Normalize
is two passes; ops on independent columns share one). Each pass maps partitions to partial
statistics on the engine and merges them as they arrive.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import polars as pl

from hugerec.data.preprocess.categorical import Categorify, HashBucket, HashedCross
from hugerec.data.preprocess.dataset import Dataset, Format
from hugerec.data.preprocess.encoding import CountEncoding, TargetEncoding
from hugerec.data.preprocess.engine import Engine, parallelism, run_tasks
from hugerec.data.preprocess.errors import OnError, RowError, SkipReport
from hugerec.data.preprocess.grouping import Agg, Groupby
from hugerec.data.preprocess.lists import ListSlice, SplitList
from hugerec.data.preprocess.numeric import Binarize, Bucketize, Clip, FillMissing, LogOp, Normalize
from hugerec.data.preprocess.op import ROW_ID, FittableOp, Op
from hugerec.data.preprocess.stats import Stats
from hugerec.data.preprocess.tasks import (
    FitJob,
    TransformJob,
    fit_reads,
    fit_task,
    group_keys,
    transform_task,
)
from hugerec.data.preprocess.temporal import CyclicTime, DifferenceLag, ParseTime

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
OPS: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Categorify,
        HashBucket,
        HashedCross,
        FillMissing,
        Clip,
        LogOp,
        Normalize,
        Bucketize,
        TargetEncoding,
        CountEncoding,
        CyclicTime,
        DifferenceLag,
        Groupby,
        ParseTime,
        SplitList,
        ListSlice,
        Binarize,
    )
}


@dataclass(frozen=True)
class TransformResult:
    paths: tuple[str, ...]  # one Parquet shard per input partition, in partition order
    rows: int  # rows written
    report: SkipReport  # rows read and rows skipped as bad input


class Workflow:
    """Ops applied in order; `fit` gathers their statistics, then every transform uses them unchanged.

    output_columns: the columns to keep at the end (default: every column, inputs included).
    """

    def __init__(self, ops: Sequence[Op], *, output_columns: Sequence[str] | None = None) -> None:
        self.ops: tuple[Op, ...] = tuple(ops)
        if not self.ops:
            raise ValueError("Workflow: needs at least one op")
        for i, op in enumerate(self.ops):
            if type(op).__name__ not in OPS:
                raise ValueError(f"Workflow: op {i} is {op!r}, not one of {sorted(OPS)}")
            if isinstance(op, Groupby) and i != len(self.ops) - 1:
                raise ValueError(f"Workflow: Groupby replaces all columns, so it must be the last op (it is op {i})")
        self.output_columns = tuple(output_columns) if output_columns is not None else None
        self.stats: list[Stats | None] = [None] * len(self.ops)
        self.input_schema: dict[str, pl.DataType] | None = None
        self.text_nulls: tuple[str, ...] | None = None  # fitted on text: these strings (and "") read as null
        self.fit_report: SkipReport | None = None
        self.fit_fingerprint: list[str] = []

    def __repr__(self) -> str:
        ops = ",\n  ".join(repr(op) for op in self.ops)
        return f"Workflow([\n  {ops}\n], fitted={self.is_fitted})"

    @property
    def is_fitted(self) -> bool:
        return self.input_schema is not None and all(
            s is not None or not op.stateful for op, s in zip(self.ops, self.stats, strict=True)
        )

    # -- checks ----------------------------------------------------------------------------------
    def _check_columns(self, schema: Mapping[str, pl.DataType], *, fitting: bool) -> None:
        available = set(schema)
        for i, op in enumerate(self.ops):
            reads = fit_reads(op) if fitting else op.reads()
            missing = [c for c in reads if c not in available]
            if missing:
                raise ValueError(
                    f"Workflow: op {i} {type(op).__name__} reads unknown column(s) {missing}; "
                    f"available at that point: {sorted(c for c in available if c != ROW_ID)}"
                )
            available = set(op.writes()) if isinstance(op, Groupby) else available | set(op.writes())
        if self.output_columns is not None:
            missing = [c for c in self.output_columns if c not in available]
            if missing:
                raise ValueError(f"Workflow: output_columns {missing} are not produced; have {sorted(available)}")

    def check_dtypes(self, schema: Mapping[str, pl.DataType], where: str) -> None:
        """Refuse data whose columns have another kind of type than the data the workflow was fitted on.

        Numbers of another width convert (Int32 -> Int64, Int64 -> Float32); anything else (text fitted,
        integers given, or the reverse) would map every value to the out-of-vocabulary id or to null
        without a word, so it is an error naming the column."""
        fitted = self._require_fitted()
        for c, dtype in schema.items():
            want = fitted.get(c)
            if want is None or dtype == want or (_numeric(dtype) and _numeric(want)) or dtype == pl.Null:
                continue
            raise ValueError(
                f"{where}: column {c!r} holds {dtype} but the workflow was fitted on {want}; read it with the "
                f"same type as the training data (converting would map its values to out-of-vocabulary ids)"
            )

    def _whole_partitions(self, dataset: Dataset) -> bool:
        """Group ops need each group in one partition, read as one frame."""
        keys = [k for op in self.ops if (k := group_keys(op)) is not None]
        if not keys:
            return False
        if len(dataset.partitions()) > 1:
            for op_keys in keys:
                if not dataset.partitioned_by or not set(dataset.partitioned_by) <= set(op_keys):
                    raise ValueError(
                        f"Workflow: an op groups by {list(op_keys)}, which needs every group in one partition, but "
                        f"the dataset has several partitions and partitioned_by={list(dataset.partitioned_by)}; "
                        f"use repartition(dataset, by={list(op_keys)}, ...) or a single partition"
                    )
        return True

    def _require_fitted(self) -> dict[str, pl.DataType]:
        if self.input_schema is None or not self.is_fitted:
            raise ValueError("Workflow: not fitted; call fit(dataset) or Workflow.load(path) first")
        return self.input_schema

    # -- fit ---------------------------------------------------------------------------------------
    def _next_pass(self, fitted: Sequence[bool]) -> tuple[int, ...]:
        """Stateful ops whose inputs are final once the fitted ops before them have run."""
        dirty: set[str] = set()
        to_fit = []
        for i, op in enumerate(self.ops):
            if set(fit_reads(op)) & dirty:
                dirty |= set(op.writes())
            elif not fitted[i]:
                to_fit.append(i)
                dirty |= set(op.writes())
        return tuple(to_fit)

    def fit(
        self, data: Dataset | pl.DataFrame, *, engine: Engine = None, on_error: OnError | str = OnError.RAISE
    ) -> Workflow:
        """Gather every stateful op's statistics over the whole dataset; returns self."""
        dataset = data if isinstance(data, Dataset) else Dataset.from_frames(data)
        on_error = OnError(on_error)
        self._check_columns(dataset.schema, fitting=True)
        whole = self._whole_partitions(dataset)
        partitions = dataset.partitions()
        # a few groups of partitions per parallel slot (balanced work, few partial results to merge
        # here); in this process, one group, so only one vocabulary-sized accumulator is ever alive
        slots = parallelism(engine)
        num_groups = min(len(partitions), 4 * slots if slots > 1 else 1)
        groups = [tuple(partitions[g::num_groups]) for g in range(num_groups)]
        self.stats = [None] * len(self.ops)
        self.input_schema = dict(dataset.schema)
        self.text_nulls = ("", *dataset.csv.null_values) if dataset.format is Format.CSV else None
        fitted = [not op.stateful for op in self.ops]
        report: SkipReport | None = None
        while not all(fitted):
            to_fit = self._next_pass(fitted)
            job = FitJob(self, to_fit, on_error, whole)
            merged: dict[int, Stats] = {}
            pass_report = SkipReport()
            for partial, part_report in run_tasks(fit_task, job, groups, engine):
                # each group's result is already merged over its partitions: fold it in as it arrives
                pass_report = pass_report.merge(part_report)
                merged = self._merge(to_fit, [merged, partial])
            for i in to_fit:
                self.stats[i] = cast(FittableOp, self.ops[i]).finalize(merged[i])
                fitted[i] = True
            report = report or pass_report
        self.fit_report = report or SkipReport()
        self.fit_fingerprint = dataset.fingerprint()
        if self.fit_report.rows_skipped:
            log.warning("Workflow.fit: %s", self.fit_report)
        return self

    def _merge(self, to_fit: Sequence[int], parts: Sequence[dict[int, Stats]]) -> dict[int, Stats]:
        out: dict[int, Stats] = {}
        for i in to_fit:
            present = [p[i] for p in parts if i in p]
            if present:
                out[i] = cast(FittableOp, self.ops[i]).merge(present)
        return out

    # -- transform ---------------------------------------------------------------------------------
    def apply_op(self, i: int, frame: pl.DataFrame) -> pl.DataFrame:
        """Op i on a frame, with its fitted statistics (no column checks or casts: see transform_frame)."""
        op = self.ops[i]
        try:
            return op.transform(frame, self.stats[i] or {})
        except pl.exceptions.PolarsError as e:
            raise ValueError(f"Workflow: op {i} {op!r} failed: {e}") from e

    def apply_ops(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Every op in order, then the output selection (out of fold when `frame` carries ROW_ID)."""
        for i in range(len(self.ops)):
            frame = self.apply_op(i, frame)
        frame = frame.drop(ROW_ID, strict=False)
        return frame.select(self.output_columns) if self.output_columns is not None else frame

    def output_schema(self) -> pl.Schema:
        """Column -> dtype of the transformed data."""
        return self.apply_ops(pl.DataFrame(schema=self._require_fitted())).schema

    def cardinalities(self) -> dict[str, int]:
        """Id-valued output column -> number of ids (ids lie in [0, cardinality)), for embedding tables."""
        self._require_fitted()
        cards: dict[str, int] = {}
        for op, stats in zip(self.ops, self.stats, strict=True):
            upstream = cards
            cards = {c: n for c, n in cards.items() if c not in op.writes()}
            match op:
                case Categorify():
                    assert stats is not None
                    cards |= {c: op.cardinality(stats, c) for c in op.columns}
                case HashBucket():
                    cards |= dict.fromkeys(op.columns, op.num_buckets + 1)
                case HashedCross():
                    cards[op.name] = op.num_buckets
                case Bucketize():
                    cards |= dict.fromkeys(op.columns, op.cardinality)
                case Groupby():
                    cards = {c: upstream[c] for c in op.group_by if c in upstream}
                    id_aggs = (Agg.LIST, Agg.FIRST, Agg.LAST)
                    for (c, agg), name in zip(op.aggregations, op.outputs(), strict=True):
                        if agg in id_aggs and c in upstream:
                            cards[name] = upstream[c]
        outputs = self.output_schema()
        return {c: n for c, n in cards.items() if c in outputs}

    def transform_frame(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Transform an in-memory frame (with full statistics; columns cast to the fitted dtypes)."""
        schema = self._require_fitted()
        self._check_columns({c: frame.schema[c] for c in frame.columns}, fitting=False)
        self.check_dtypes(frame.schema, "Workflow.transform_frame")
        casts = {c: schema[c] for c in frame.columns if c in schema and frame.schema[c] != schema[c]}
        try:
            frame = frame.cast(casts) if casts else frame  # type: ignore[arg-type]  # a dict of dtypes
        except pl.exceptions.PolarsError as e:
            raise ValueError(
                f"Workflow.transform_frame: columns {sorted(casts)} do not convert to the fitted dtypes: {e}"
            ) from e
        return self.apply_ops(frame)

    def transform(
        self,
        data: Dataset | pl.DataFrame,
        output_dir: str | Path,
        *,
        engine: Engine = None,
        on_error: OnError | str = OnError.RAISE,
        out_of_fold: bool = False,
        row_group_size: int = 128 * 1024,
        min_row_groups: int = 8,
        overwrite: bool = False,
    ) -> TransformResult:
        """Transform every partition into `output_dir/part-NNNNN.parquet`.

        out_of_fold: the data is the dataset the workflow was fitted on (checked), and TargetEncoding
        must use out-of-fold statistics (no target leakage into training features).
        row_group_size / min_row_groups: row groups hold at most `row_group_size` rows, and an output
        of few partitions is cut finer so that it has at least `min_row_groups` of them (as its rows
        allow): row groups are the loader's unit of per-rank sharding, so a small dataset can still be
        read by that many ranks.
        """
        self._require_fitted()
        if row_group_size < 1 or min_row_groups < 1:
            raise ValueError(
                f"Workflow.transform: row_group_size and min_row_groups must be >= 1, got {row_group_size}, "
                f"{min_row_groups}"
            )
        data = data if isinstance(data, Dataset) else Dataset.from_frames(data)
        self._check_columns(data.schema, fitting=False)
        self.check_dtypes(data.schema, "Workflow.transform")
        if out_of_fold and data.fingerprint() != self.fit_fingerprint:
            raise ValueError("Workflow.transform: out_of_fold=True needs the exact dataset the workflow was fitted on")
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        stale = sorted(out.glob("part-*.parquet"))
        if stale and not overwrite:
            raise ValueError(f"Workflow.transform: {out} already holds {len(stale)} part files; pass overwrite=True")
        for stale_path in stale:
            stale_path.unlink()
        partitions = data.partitions()
        job = TransformJob(
            self,
            str(out),
            OnError(on_error),
            out_of_fold,
            self._whole_partitions(data),
            row_group_size,
            -(-min_row_groups // max(len(partitions), 1)),
            self.output_schema(),
        )
        paths: list[str] = []
        rows, report = 0, SkipReport()
        for path, n, part_report in run_tasks(transform_task, job, partitions, engine):
            paths.append(path)
            rows += n
            report = report.merge(part_report)
        if report.rows_skipped:
            log.warning("Workflow.transform: %s", report)
        return TransformResult(tuple(paths), rows, report)

    def fit_transform(
        self,
        data: Dataset | pl.DataFrame,
        output_dir: str | Path,
        *,
        engine: Engine = None,
        on_error: OnError | str = OnError.RAISE,
        row_group_size: int = 128 * 1024,
        min_row_groups: int = 8,
        overwrite: bool = False,
    ) -> TransformResult:
        """Fit on the training data, then transform it out of fold (see TargetEncoding)."""
        dataset = data if isinstance(data, Dataset) else Dataset.from_frames(data)
        self.fit(dataset, engine=engine, on_error=on_error)
        return self.transform(
            dataset,
            output_dir,
            engine=engine,
            on_error=on_error,
            out_of_fold=True,
            row_group_size=row_group_size,
            min_row_groups=min_row_groups,
            overwrite=overwrite,
        )

    def transform_request(self, request: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> pl.DataFrame:
        """Transform raw serving rows (a dict of column -> value, or a list of them) exactly as the
        training data: values convert to the fitted dtypes as the training files' text did ("" and the
        file's null markers are null when it was fitted on CSV); a missing key means a missing value;
        columns no op reads and the request lacks (the label) are left out."""
        schema = self._require_fitted()
        rows = [request] if isinstance(request, Mapping) else list(request)
        unknown = sorted({k for row in rows for k in row if k not in schema})
        if unknown:
            raise ValueError(f"Workflow.transform_request: unknown column(s) {unknown}; expected {list(schema)}")
        needed = {c for op in self.ops for c in op.reads()}
        present = {k for row in rows for k in row}
        typed: dict[str, pl.Series] = {}
        as_text: dict[str, list[str | None]] = {}  # converted together, in one pass, as the reader did
        for c, dtype in schema.items():
            if c not in present and c not in needed:
                continue
            values = [row.get(c) for row in rows]
            if self.text_nulls is not None:
                values = [None if isinstance(v, str) and v in self.text_nulls else v for v in values]
            series = _typed_column(c, dtype, values)
            if series is not None:
                typed[c] = series
            elif isinstance(dtype, pl.List | pl.Array | pl.Struct):
                raise ValueError(f"Workflow.transform_request: column {c!r} expects {dtype}, got {values!r}")
            else:
                as_text[c] = [None if v is None else str(v) for v in values]
        if as_text:
            text = pl.DataFrame(as_text, schema=dict.fromkeys(as_text, pl.String()))
            converted = text.select([pl.col(c).cast(schema[c], strict=False) for c in as_text])
            failed = text.select(pl.col(c).is_not_null() & converted[c].is_null() for c in as_text)
            for c, bad in zip(as_text, failed.select(pl.all().any()).row(0), strict=True):
                if bad:
                    value = text[c].filter(failed[c])[0]
                    raise ValueError(
                        f"Workflow.transform_request: column {c!r} value {value!r} does not convert to {schema[c]}"
                    )
            typed |= {c: converted[c] for c in as_text}
        return self.apply_ops(pl.DataFrame([typed[c] for c in schema if c in typed]))

    # -- config, save / load -----------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        """The ops and output selection as JSON-able data (no statistics)."""
        return {
            "ops": [{"op": type(op).__name__, "config": _config_json(op)} for op in self.ops],
            "output_columns": list(self.output_columns) if self.output_columns is not None else None,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Workflow:
        """An unfitted workflow from `to_config()` data (what workflow.json holds; a config's
        [[preprocess.ops]] tables are the flat form of `from_spec`)::

        {"ops": [{"op": "Categorify", "config": {"columns": ["C1"], "freq_threshold": 3}}, ...],
         "output_columns": null}
        """
        ops = []
        for i, entry in enumerate(config.get("ops", [])):
            name = entry.get("op") if isinstance(entry, Mapping) else None
            if name not in OPS:
                raise ValueError(f"Workflow.from_config: op {i} is {name!r}, not one of {sorted(OPS)}")
            try:
                ops.append(OPS[name](**entry.get("config", {})))
            except TypeError as e:
                raise ValueError(f"Workflow.from_config: op {i} {name}: {e}") from e
        return cls(ops, output_columns=config.get("output_columns"))

    def to_spec(self) -> list[dict[str, Any]]:
        """The ops as flat tables, `{"op": "Categorify", "columns": [...], "freq_threshold": 3}`: what a
        `[[preprocess.ops]]` entry of a TOML config says (Workflow.from_spec reads it back)."""
        return [{"op": e["op"], **e["config"]} for e in self.to_config()["ops"]]

    @classmethod
    def from_spec(
        cls, ops: Sequence[Mapping[str, Any]], *, output_columns: Sequence[str] | None = None, where: str = "ops"
    ) -> Workflow:
        """An unfitted workflow from flat op tables (see `to_spec`); a mistake names its entry and key
        (`ops[2].freq_threshold: ...`) and the parameters the op takes."""
        built: list[Op] = []
        for i, entry in enumerate(ops):
            at = f"{where}[{i}]"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{at}: expected a table like {{op = \"Categorify\", columns = [...]}}, got {entry!r}")
            name = entry.get("op")
            if name not in OPS:
                raise ValueError(f"{at}.op: {name!r} is not one of {sorted(OPS)}")
            params = {k: v for k, v in entry.items() if k != "op"}
            known = [f.name for f in dataclasses.fields(OPS[name])]
            unknown = sorted(set(params) - set(known))
            if unknown:
                raise ValueError(f"{at}.{unknown[0]}: {name} has no parameter {unknown[0]!r}; it takes {known}")
            try:
                built.append(OPS[name](**params))
            except TypeError as e:
                raise ValueError(f"{at} ({name}): {e}; it takes {known}") from None
            except ValueError as e:
                raise ValueError(f"{at} ({name}): {e}") from None
        if not built:
            raise ValueError(f"{where}: give at least one op")
        return cls(built, output_columns=output_columns)

    def save(self, path: str | Path) -> None:
        """Write `path/workflow.json` (ops, settings) and Parquet statistics; no pickled code."""
        schema = self._require_fitted()
        root = Path(path)
        (root / "stats").mkdir(parents=True, exist_ok=True)
        pl.DataFrame(schema=schema).write_parquet(root / "input_schema.parquet")
        stats_files: list[dict[str, str] | None] = []
        for i, stats in enumerate(self.stats):
            if stats is None:
                stats_files.append(None)
                continue
            files = {}
            for j, (name, frame) in enumerate(stats.items()):
                rel = f"stats/op{i:03d}_{j:03d}.parquet"
                frame.write_parquet(root / rel)
                files[name] = rel
            stats_files.append(files)
        report = self.fit_report or SkipReport()
        meta = {
            "format_version": FORMAT_VERSION,
            **self.to_config(),
            "stats": stats_files,
            "text_nulls": list(self.text_nulls) if self.text_nulls is not None else None,
            "fit_fingerprint": self.fit_fingerprint,
            "fit_report": {
                "rows_read": report.rows_read,
                "rows_skipped": report.rows_skipped,
                "examples": [dataclasses.asdict(e) for e in report.examples],
            },
        }
        (root / "workflow.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Workflow:
        """A fitted workflow as `save` wrote it, ready to transform (training data or requests)."""
        root = Path(path)
        meta = json.loads((root / "workflow.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"Workflow.load: {root} has format version {meta.get('format_version')}, expected {FORMAT_VERSION}"
            )
        wf = cls.from_config(meta)
        wf.input_schema = dict(pl.read_parquet_schema(root / "input_schema.parquet"))
        wf.stats = [
            {name: pl.read_parquet(root / rel) for name, rel in files.items()} if files is not None else None
            for files in meta["stats"]
        ]
        wf.text_nulls = tuple(meta["text_nulls"]) if meta["text_nulls"] is not None else None
        wf.fit_fingerprint = list(meta["fit_fingerprint"])
        report = meta["fit_report"]
        examples = tuple(RowError(**e) for e in report["examples"])
        wf.fit_report = SkipReport(report["rows_read"], report["rows_skipped"], examples)
        return wf


def _numeric(dtype: pl.DataType) -> bool:
    return dtype.is_numeric() or dtype == pl.Boolean


def _jsonable(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _config_json(op: Op) -> dict[str, object]:
    assert dataclasses.is_dataclass(op)
    return {f.name: _jsonable(getattr(op, f.name)) for f in dataclasses.fields(op)}


def _typed_column(name: str, dtype: pl.DataType, values: list[Any]) -> pl.Series | None:
    """The values as a column of the fitted dtype, or None when they must be converted from text (the
    strings of a parsed line, or Python values of another type)."""
    if dtype != pl.String and any(isinstance(v, str) for v in values):
        return None
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        return None
