"""Bad input: where it is (file, line or row group, column) and what was wrong, raised or counted.

`on_error="raise"` (the default) stops at the first bad row with a `BadInputError`;
`on_error="skip"` drops bad rows and counts them in a `SkipReport`, which the workflow returns and
logs, so nothing disappears silently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

MAX_EXAMPLES = 20


class OnError(enum.Enum):
    RAISE = "raise"
    SKIP = "skip"


@dataclass(frozen=True)
class RowError:
    """One bad row. `line` is 1-based in the text file; `row` is 0-based inside `row_group` (Parquet)
    or inside the in-memory frame."""

    path: str
    reason: str
    line: int | None = None
    row_group: int | None = None
    row: int | None = None
    column: str | None = None
    value: str | None = None
    fix: str | None = None  # what the config should say instead, where skipping rows is not the remedy

    def __str__(self) -> str:
        where = [self.path or "<frame>"]
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.row_group is not None:
            where.append(f"row group {self.row_group}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        value = "" if self.value is None else f" (value {self.value!r})"
        return f"{', '.join(where)}: {self.reason}{value}"


class BadInputError(ValueError):
    """A row of the input could not be read as the schema says."""

    def __init__(self, error: RowError) -> None:
        remedy = error.fix or "on_error='skip' (preprocess.on_error = \"skip\" in a config) drops and counts such rows"
        super().__init__(f"bad input at {error}; {remedy}")
        self.error = error

    def __reduce__(self) -> tuple[type[BadInputError], tuple[RowError]]:
        # rebuilt from the RowError, not the message, when it crosses a process boundary
        return BadInputError, (self.error,)


@dataclass(frozen=True)
class SkipReport:
    """Rows read and rows dropped as bad (with the first few reasons); mergeable across partitions."""

    rows_read: int = 0
    rows_skipped: int = 0
    examples: tuple[RowError, ...] = field(default_factory=tuple)

    def merge(self, other: SkipReport) -> SkipReport:
        return SkipReport(
            self.rows_read + other.rows_read,
            self.rows_skipped + other.rows_skipped,
            (self.examples + other.examples)[:MAX_EXAMPLES],
        )

    def __str__(self) -> str:
        lines = [f"{self.rows_skipped} of {self.rows_read} rows skipped as bad input"]
        lines += [f"  {e}" for e in self.examples]
        if self.rows_skipped > len(self.examples):
            lines.append(f"  ... and {self.rows_skipped - len(self.examples)} more")
        return "\n".join(lines)
