"""The worker processes of these tests run Numba's workqueue threading layer.

Numba's default OpenMP layer shares libgomp with torch; after each parallel Numba kernel its waiting
threads slow torch's own CPU ops down by orders of magnitude on a busy machine (see the report in
benchmarks/distributed.py). The variable reaches the forkserver that spawn() starts later in this
session; a process that imported Numba already keeps its layer.
"""

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
