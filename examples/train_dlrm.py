"""Train and evaluate a DLRM on a synthetic click log, with the Python API (no config file).

    python examples/train_dlrm.py [--rows-per-file 65536]

The generator draws labels from a hidden model, so it knows the best AUC any model can reach
(the oracle AUC); the script prints the model's AUC next to it, saves the model, loads it back and
scores it again, then exports it as a bundle and loads that as the server would, scoring raw rows.
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import hugerec as hr
from hugerec import data, models, training

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows-per-file", type=int, default=1 << 16, help="rows of each of the 5 data files (the last is held out)")
args = parser.parse_args()

with tempfile.TemporaryDirectory() as tmp:
    # 1. Data: 13 dense features and 4 categorical ones, ids already in 0..cardinality-1.
    schema = data.Schema.build(
        dense=[f"d{i}" for i in range(13)],
        sparse={"user": 50_000, "item": 20_000, "category": 300, "hour": 24},
    )
    rows_per_file = args.rows_per_file
    synthetic = data.SyntheticConfig(schema, num_rows=5 * rows_per_file, rows_per_file=rows_per_file, row_group_rows=min(rows_per_file, 1 << 16))
    report = data.generate(synthetic, tmp)
    train_files, eval_files = report.paths[:-1], report.paths[-1:]  # the last file is held out
    train_data = data.load(train_files, schema, batch_size=2048, shuffle=True)
    eval_data = data.load(eval_files, schema, batch_size=8192)

    # 2. Model: one table per categorical feature, trained by a fused row-wise Adagrad inside backward.
    tables = schema.table_configs(dim=16)
    optimizer = hr.RowWiseAdagrad(lr=0.05)
    model_config = models.DLRMConfig(bottom=(64, 16), top=(64, 32, 1))
    model = models.build_model(model_config, tables, num_dense=13, optimizer=optimizer)

    # 3. Train one epoch (dense part: Adam), then evaluate; metrics.jsonl, curves.png, checkpoints in out_dir.
    config = training.TrainConfig(epochs=1, lr=0.002, out_dir=str(Path(tmp) / "run"))
    history = training.fit(model, train_data, eval_data, config)

    final = history.final_eval
    assert final is not None
    print(f"eval AUC {final['auc']:.4f} (oracle {report.oracle_auc['label']:.4f}), logloss {final['logloss']:.4f}")

    # 4. Save the trained model (config, tables, schema and weights), rebuild it from the file, score again.
    path = training.save_model(Path(tmp) / "model.pt", model, model_config, optimizer, tables=tables, schema=schema.to_dict())
    saved = training.load_model(path)
    again = training.evaluate(saved.model, eval_data)
    print(f"reloaded from {path.name}: eval AUC {again['auc']:.4f}")

    # 5. Export the model file as a bundle (dense program + embedding rows + schema) and load it as the
    #    server does (`hugerec serve` loads it the same way); score raw rows in process, as /predict would.
    bundle = hr.serving.export(path, Path(tmp) / "bundle", name="dlrm")
    served = hr.serving.load(bundle)
    try:
        batch = next(iter(eval_data))
        rows = [
            {**{name: float(batch.dense[i, j]) for j, name in enumerate(schema.dense_names)},
             **{f: batch.sparse[f].to_lists()[i] for f in schema.sparse_names}}
            for i in range(8)
        ]  # fmt: skip
        logits = served.model.predict(served.preprocess(rows))
        with torch.no_grad():
            expected = saved.model.eval()(batch)[:8].numpy()
        assert np.allclose(logits, expected, rtol=1e-4, atol=1e-5)
        print(f"served {served.kind} bundle {served.name!r}: the first 8 eval rows score as in memory")
    finally:
        served.close()
