"""The lookup plan: which features of a SparseFeatures batch one fused table group serves, and where.

A group is one buffer `weight [R, D_pad]` holding several tables' rows back to back (row offsets),
all of width D. The plan is an int64 tensor [F_g, 7], one line per feature the group serves:

    FEATURE     index of the feature in the batch: its bags are offsets[FEATURE*B : (FEATURE+1)*B + 1]
    TABLE       index of the feature's table inside the group (0..T_g-1; per-table state such as
                Adam's step, and the partition the backward deduplicates in)
    ROW_OFFSET  first row of the table in the group buffer
    NUM_ROWS    rows of the table: ids must lie in [0, NUM_ROWS)
    COLUMN      pooled ops: first output column of the feature in out [B, C];
                sequence ops: first output row of the feature in out [N_g, D]
    MEAN        1: MEAN pooling (divide by the number of ids that have a row), 0: SUM
    MISSING_OK  1: id -1 means "no row" (zero vector, no update, not counted by MEAN); 0: -1 is invalid

Ids outside [0, NUM_ROWS) (and -1 where MISSING_OK is 0) are *invalid*: they contribute nothing,
and the lookups return how many they saw so that the caller raises a clear error.
"""

from __future__ import annotations

FEATURE = 0
TABLE = 1
ROW_OFFSET = 2
NUM_ROWS = 3
COLUMN = 4
MEAN = 5
MISSING_OK = 6
WIDTH = 7
