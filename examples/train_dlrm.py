"""Train and evaluate a DLRM on a synthetic click log, with the Python API (no config file).

    python examples/train_dlrm.py

The generator draws labels from a hidden model, so it knows the best AUC any model can reach
(the oracle AUC); the script prints the model's AUC next to it, then saves the model, loads it back
and scores it again.
"""

import tempfile
from pathlib import Path

import hugerec as hr
from hugerec import data, models, training

with tempfile.TemporaryDirectory() as tmp:
    # 1. Data: 13 dense features and 4 categorical ones, ids already in 0..cardinality-1.
    schema = data.Schema.build(
        dense=[f"d{i}" for i in range(13)],
        sparse={"user": 50_000, "item": 20_000, "category": 300, "hour": 24},
    )
    rows_per_file = 1 << 16
    report = data.generate(data.SyntheticConfig(schema, num_rows=5 * rows_per_file, rows_per_file=rows_per_file), tmp)
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
