"""The child side of a GBM model load: the library parses the model file in a process of its own.

    python -I gbm_probe.py REQUEST.json     (started by isolated_load.run_child, never imported by a server)

REQUEST.json: {"library": "lightgbm" | "xgboost", "model": file, "rows": .npy file of probe rows
[P, F] float32, "result": where to write the answer, "memory_bytes": address-space limit}. The answer
is JSON: {"num_features", "feature_names", "margins" [P]} (the library's raw scores of the probe rows),
or {"error": "..."} when the library raises. A crash (SIGSEGV, SIGABRT) or a hang of the library ends
this process only; the parent reads the answer as JSON, never as a pickle.

This file imports nothing of hugerec (a fresh interpreter starts in about a second), and blocks the
optional packages the libraries would import to convert data frames (pandas, scikit-learn, dask...),
which loading a model file does not need and which would triple the start-up time.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

_NOT_NEEDED = (
    "pandas", "sklearn", "dask", "distributed", "pyarrow", "polars", "matplotlib", "graphviz", "cffi",
    "datatable", "cupy", "cudf", "pyspark", "torch",
)  # fmt: skip


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Load the model with its library and score the probe rows (the library's raw scores)."""
    import numpy as np

    rows = np.load(request["rows"], allow_pickle=False)
    model = str(request["model"])
    match request["library"]:
        case "lightgbm":
            import lightgbm

            lgb = lightgbm.Booster(model_file=model)
            names = list(lgb.feature_name())
            margins = lgb.predict(rows, raw_score=True, num_threads=1)
            num_features = int(lgb.num_feature())
        case "xgboost":
            import xgboost

            xgb = xgboost.Booster(params={"nthread": 1}, model_file=model)
            names = list(xgb.feature_names or ())
            margins = xgb.inplace_predict(rows, predict_type="margin")
            num_features = int(xgb.num_features())
        case other:
            raise ValueError(f"unknown library {other!r}")
    return {
        "num_features": num_features,
        "feature_names": [str(n) for n in names],
        "margins": [float(v) for v in np.asarray(margins, np.float64).reshape(-1)],
    }


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    limit = int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a file that asks for more fails here, not the host
    for name in _NOT_NEEDED:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError: the libraries go on without it
    try:
        answer = probe(request)
    except Exception as e:  # the library's own error for a file it refuses: the parent names it
        answer = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"}
    result = Path(request["result"])
    tmp = result.with_suffix(".tmp")
    tmp.write_text(json.dumps(answer))
    os.replace(tmp, result)  # the parent never reads half an answer
    return 1 if "error" in answer else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
