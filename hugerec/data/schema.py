"""Schema: which columns a dataset has (labels, dense floats, sparse ids) and how big each vocabulary is.

    Schema.criteo() ->  label | I1..I13 (dense) | C1..C26 (sparse, one id per row)
    schema.with_cardinalities({"C1": 1460, ...}).table_configs(dim=16) -> [TableConfig("C1", 1460, 16), ...]

One schema describes both raw files (for the readers: `dtype` says how a text field is parsed) and
trainable Parquet shards (for the loader: sparse columns hold ids in 0..cardinality-1, one per row
or a list per row when `multi_hot`).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from hugerec.embedding.table_config import Pooling, TableConfig


class ColumnKind(enum.Enum):
    LABEL = "label"
    DENSE = "dense"
    SPARSE = "sparse"


class ValueType(enum.Enum):
    """How a column's values are typed (and, in text files, parsed)."""

    INT = "int"  # integers -> int64
    FLOAT = "float"  # real numbers -> float32
    STRING = "string"  # raw categorical strings (Categorify turns them into ids)
    HEX = "hex"  # raw categorical hex strings, parsed to int64 (Criteo C1..C26)


_E = TypeVar("_E", bound=enum.Enum)

_DEFAULT_DTYPE = {
    ColumnKind.LABEL: ValueType.FLOAT,
    ColumnKind.DENSE: ValueType.FLOAT,
    ColumnKind.SPARSE: ValueType.INT,
}


@dataclass(frozen=True)
class Column:
    """One column.

    name         column name in the files
    kind         LABEL, DENSE or SPARSE
    dtype        value type; default FLOAT for labels and dense, INT for sparse
    cardinality  sparse only: ids are in 0..cardinality-1; None until known (e.g. before Categorify)
    multi_hot    sparse only: a list of ids per row instead of one id
    table        sparse only: embedding table name; columns naming the same table share it (default: name)
    """

    name: str
    kind: ColumnKind
    dtype: ValueType | None = None
    cardinality: int | None = None
    multi_hot: bool = False
    table: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Column: name must be a non-empty string, got {self.name!r}")
        if isinstance(self.kind, str):
            object.__setattr__(self, "kind", _enum(ColumnKind, self.kind, f"Column {self.name!r}: kind"))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", _enum(ValueType, self.dtype, f"Column {self.name!r}: dtype"))
        if self.dtype is None:
            object.__setattr__(self, "dtype", _DEFAULT_DTYPE[self.kind])
        if self.kind is not ColumnKind.SPARSE:
            if self.cardinality is not None or self.multi_hot or self.table is not None:
                raise ValueError(
                    f"Column {self.name!r}: cardinality/multi_hot/table are for sparse columns, not {self.kind.value}"
                )
            if self.dtype not in (ValueType.INT, ValueType.FLOAT):
                raise ValueError(
                    f"Column {self.name!r}: a {self.kind.value} column must be int or float, got {self.dtype}"
                )
        if self.cardinality is not None and (
            isinstance(self.cardinality, bool) or not isinstance(self.cardinality, int) or self.cardinality <= 0
        ):
            raise ValueError(
                f"Column {self.name!r}: cardinality must be a positive int or None, got {self.cardinality!r}"
            )
        if self.table is not None and (not isinstance(self.table, str) or not self.table):
            raise ValueError(f"Column {self.name!r}: table must be a non-empty string or None, got {self.table!r}")

    @property
    def table_name(self) -> str:
        """Embedding table this sparse column is looked up in."""
        return self.table or self.name

    def to_dict(self) -> dict[str, Any]:
        assert self.dtype is not None  # set in __post_init__
        d: dict[str, Any] = {"name": self.name, "kind": self.kind.value, "dtype": self.dtype.value}
        if self.kind is ColumnKind.SPARSE:
            d.update(cardinality=self.cardinality, multi_hot=self.multi_hot, table=self.table)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Column:
        unknown = set(d) - {"name", "kind", "dtype", "cardinality", "multi_hot", "table"}
        if unknown:
            raise ValueError(f"Column.from_dict: unknown keys {sorted(unknown)} in {dict(d)}")
        if "name" not in d or "kind" not in d:
            raise ValueError(f"Column.from_dict: 'name' and 'kind' are required, got {dict(d)}")
        return Column(
            name=d["name"],
            kind=d["kind"],
            dtype=d.get("dtype"),
            cardinality=d.get("cardinality"),
            multi_hot=bool(d.get("multi_hot", False)),
            table=d.get("table"),
        )


@dataclass(frozen=True)
class DimRule:
    """Default embedding width from a vocabulary size (NVTabular's `get_embedding_sizes` rule, rounded).

    dim = clamp(ceil_to_multiple(multiplier * cardinality ** exponent, multiple), minimum, maximum)
    e.g. cardinality 3 -> 16, 1_460 -> 120, 100_000 -> 512 (with the defaults)
    """

    multiplier: float = 2.0
    exponent: float = 0.56
    minimum: int = 16
    maximum: int = 512
    multiple: int = 8

    def __post_init__(self) -> None:
        if not self.multiplier > 0 or not self.exponent > 0:
            raise ValueError(f"DimRule: multiplier and exponent must be > 0, got {self.multiplier}, {self.exponent}")
        if self.multiple < 1 or self.minimum < 1 or self.maximum < self.minimum:
            raise ValueError(
                f"DimRule: need multiple >= 1 and 1 <= minimum <= maximum, got multiple={self.multiple}, "
                f"minimum={self.minimum}, maximum={self.maximum}"
            )

    def __call__(self, cardinality: int) -> int:
        raw = self.multiplier * cardinality**self.exponent
        dim = math.ceil(raw / self.multiple) * self.multiple
        return max(self.minimum, min(self.maximum, dim))


@dataclass(frozen=True)
class Schema:
    """An ordered set of columns: at least one label; dense and sparse features in file order."""

    columns: tuple[Column, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.columns, tuple):
            object.__setattr__(self, "columns", tuple(self.columns))
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"Schema: duplicate column names {dup}")
        if not self.labels:
            raise ValueError(f"Schema: needs at least one label column, got columns {names}")
        by_table: dict[str, list[Column]] = {}
        for c in self.sparse:
            by_table.setdefault(c.table_name, []).append(c)
        for table, cols in by_table.items():
            if len({c.cardinality for c in cols}) > 1:
                cards = {c.name: c.cardinality for c in cols}
                raise ValueError(f"Schema: columns sharing table {table!r} have different cardinalities {cards}")

    # -- construction --------------------------------------------------------------------------
    @staticmethod
    def build(
        labels: Iterable[str] = ("label",),
        dense: Iterable[str] = (),
        sparse: Mapping[str, int | None] | Iterable[str] = (),
        multi_hot: Iterable[str] = (),
        tables: Mapping[str, str] | None = None,
    ) -> Schema:
        """Schema.build(dense=["age"], sparse={"user": 1000, "items": 5000}, multi_hot=["items"])."""
        cards: Mapping[str, int | None] = sparse if isinstance(sparse, Mapping) else dict.fromkeys(sparse)
        multi = set(multi_hot)
        unknown = sorted(multi - set(cards))
        if unknown:
            raise ValueError(f"Schema.build: multi_hot names {unknown} that are not sparse columns {sorted(cards)}")
        tables = dict(tables or {})
        bad = sorted(set(tables) - set(cards))
        if bad:
            raise ValueError(f"Schema.build: tables names {bad} that are not sparse columns {sorted(cards)}")
        cols = [Column(n, ColumnKind.LABEL) for n in labels]
        cols += [Column(n, ColumnKind.DENSE) for n in dense]
        cols += [
            Column(n, ColumnKind.SPARSE, cardinality=c, multi_hot=n in multi, table=tables.get(n))
            for n, c in cards.items()
        ]
        return Schema(tuple(cols))

    @staticmethod
    def criteo(cardinalities: Mapping[str, int] | None = None) -> Schema:
        """Raw Criteo layout: label (int), I1..I13 (int counts), C1..C26 (hex hashes)."""
        cols = [Column("label", ColumnKind.LABEL, ValueType.INT)]
        cols += [Column(f"I{i}", ColumnKind.DENSE, ValueType.INT) for i in range(1, 14)]
        cols += [Column(f"C{i}", ColumnKind.SPARSE, ValueType.HEX) for i in range(1, 27)]
        schema = Schema(tuple(cols))
        return schema if cardinalities is None else schema.with_cardinalities(cardinalities)

    # -- views ---------------------------------------------------------------------------------
    def _of(self, kind: ColumnKind) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.kind is kind)

    @property
    def labels(self) -> tuple[Column, ...]:
        return self._of(ColumnKind.LABEL)

    @property
    def dense(self) -> tuple[Column, ...]:
        return self._of(ColumnKind.DENSE)

    @property
    def sparse(self) -> tuple[Column, ...]:
        return self._of(ColumnKind.SPARSE)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.labels)

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.dense)

    @property
    def sparse_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.sparse)

    def __getitem__(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"Schema: unknown column {name!r}; have {list(self.names)}")

    def __contains__(self, name: object) -> bool:
        return any(c.name == name for c in self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    # -- derived schemas -----------------------------------------------------------------------
    def with_cardinalities(self, cardinalities: Mapping[str, int]) -> Schema:
        """Copy with the given sparse columns' cardinalities set (e.g. after Categorify's fit)."""
        sparse = set(self.sparse_names)
        bad = sorted(set(cardinalities) - sparse)
        if bad:
            raise ValueError(
                f"Schema.with_cardinalities: {bad} are not sparse columns; sparse columns are {sorted(sparse)}"
            )
        cols = tuple(
            replace(c, cardinality=int(cardinalities[c.name])) if c.name in cardinalities else c for c in self.columns
        )
        return Schema(cols)

    def select(self, names: Iterable[str]) -> Schema:
        """Copy holding only `names` (in schema order); must keep a label."""
        keep = set(names)
        missing = sorted(keep - set(self.names))
        if missing:
            raise ValueError(f"Schema.select: unknown columns {missing}; have {list(self.names)}")
        return Schema(tuple(c for c in self.columns if c.name in keep))

    # -- embedding tables ----------------------------------------------------------------------
    def table_configs(
        self,
        dim: int | DimRule | None = None,
        dims: Mapping[str, int] | None = None,
        pooling: Pooling = Pooling.SUM,
    ) -> list[TableConfig]:
        """One TableConfig per embedding table, in first-use order.

        dim   one width for every table (DLRM needs that), or a DimRule; None = DimRule()
        dims  per-table overrides {table name: dim}
        Columns sharing a table become that table's `features`; num_rows = the cardinality.
        """
        if isinstance(dim, bool) or (isinstance(dim, int) and dim <= 0):
            raise ValueError(f"Schema.table_configs: dim must be a positive int or a DimRule, got {dim!r}")
        rule = DimRule() if dim is None else dim
        groups: dict[str, list[Column]] = {}
        for c in self.sparse:
            groups.setdefault(c.table_name, []).append(c)
        overrides = dict(dims or {})
        bad = sorted(set(overrides) - set(groups))
        if bad:
            raise ValueError(f"Schema.table_configs: dims names unknown tables {bad}; tables are {list(groups)}")
        out = []
        for table, cols in groups.items():
            card = cols[0].cardinality
            if card is None:
                raise ValueError(
                    f"Schema.table_configs: sparse column {cols[0].name!r} has no cardinality yet "
                    "(fit a Categorify or call with_cardinalities first)"
                )
            width = overrides.get(table, rule if isinstance(rule, int) else rule(card))
            out.append(
                TableConfig(table, num_rows=card, dim=width, features=tuple(c.name for c in cols), pooling=pooling)
            )
        return out

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"columns": [c.to_dict() for c in self.columns]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Schema:
        unknown = set(d) - {"columns"}
        if unknown or "columns" not in d:
            raise ValueError(f"Schema.from_dict: expected exactly the key 'columns', got {sorted(d)}")
        return Schema(tuple(Column.from_dict(c) for c in d["columns"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_json(s: str) -> Schema:
        return Schema.from_dict(json.loads(s))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @staticmethod
    def load(path: str | Path) -> Schema:
        p = Path(path)
        try:
            return Schema.from_json(p.read_text())
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"Schema.load: {p}: {e}") from e

    def __str__(self) -> str:
        rows = [f"{'column':<16} {'kind':<7} {'dtype':<7} {'cardinality':>12}  table"]
        for c in self.columns:
            assert c.dtype is not None
            card = "" if c.cardinality is None else str(c.cardinality)
            extra = (c.table_name + (" (multi-hot)" if c.multi_hot else "")) if c.kind is ColumnKind.SPARSE else ""
            rows.append(f"{c.name:<16} {c.kind.value:<7} {c.dtype.value:<7} {card:>12}  {extra}")
        return "\n".join(rows)


def _enum(cls: type[_E], value: str, where: str) -> _E:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not one of {[m.value for m in cls]}") from None
