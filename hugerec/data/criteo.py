"""The Criteo Display Advertising Challenge (Kaggle) format and its statistics.

label \t I1 .. I13 \t C1 .. C26      40 tab-separated fields, no header, empty field = missing
0     \t 1 \t 1 \t 5 ... \t 68fd1e64 \t 80e26c9b ...
"""

from __future__ import annotations

NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
SPARSE_NAMES = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))

# Distinct values per categorical column over the full Kaggle training set (as used by DLRM).
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

# Share of empty fields per column, measured on the first 10,000 Kaggle training rows.
DENSE_MISSING_RATES = (0.448, 0.0, 0.204, 0.198, 0.049, 0.251, 0.049, 0.001, 0.049, 0.448, 0.049, 0.773, 0.198)
SPARSE_MISSING_RATES = (
    0.0, 0.0, 0.036, 0.036, 0.0, 0.133, 0.0, 0.0, 0.0, 0.0, 0.0, 0.036, 0.0,
    0.0, 0.0, 0.036, 0.0, 0.0, 0.45, 0.45, 0.036, 0.818, 0.0, 0.036, 0.45, 0.45,
)  # fmt: skip

# Share of clicks in the Kaggle training set.
POSITIVE_RATE = 0.256
