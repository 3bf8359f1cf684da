"""Your own model in hugerec's trainer: any nn.Module from Batch to logits [B] works with `fit`.

    python examples/custom_model.py

Shows an embedding collection inside a hand-written model, and an interrupted run resumed exactly
from its checkpoint (the second `fit` continues at step 60 with the same data order, weights,
optimizer states and random streams it would have had without the interruption).
"""

import dataclasses
import tempfile

import torch
from torch import nn

import hugerec as hr
from hugerec import data, training
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.sparse import Batch


class LogisticWithEmbeddings(nn.Module):
    """logit = linear(dense) + sum over features of a learned scalar per id + a factorization-machine term."""

    def __init__(self, schema: data.Schema) -> None:
        super().__init__()
        tables = schema.table_configs(dim=8)
        self.embedding = EmbeddingCollection(tables, optimizer=hr.Adagrad(lr=0.05))
        self.bias = EmbeddingCollection([hr.TableConfig(t.name, t.num_rows, 1, t.features) for t in tables], hr.Ftrl())
        self.linear = nn.Linear(len(schema.dense), 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        vectors = self.embedding(batch.sparse).stacked()  # [B, F, 8]
        fm = 0.5 * (vectors.sum(1) ** 2 - (vectors**2).sum(1)).sum(1)  # [B]: sum of pairwise dot products
        return self.linear(batch.dense).squeeze(1) + self.bias(batch.sparse).values.sum(1) + fm


with tempfile.TemporaryDirectory() as tmp:
    schema = data.Schema.build(dense=["price", "age"], sparse={"user": 20_000, "item": 5_000, "hour": 24})
    report = data.generate(data.SyntheticConfig(schema, num_rows=200_000, rows_per_file=1 << 16), f"{tmp}/data")
    train_data = data.load(report.paths[:-1], schema, batch_size=1024, shuffle=True)
    eval_data = data.load(report.paths[-1:], schema, batch_size=8192)

    torch.manual_seed(0)
    model = LogisticWithEmbeddings(schema)
    config = training.TrainConfig(lr=0.01, checkpoint_every=20, out_dir=f"{tmp}/run", progress=False)
    training.fit(model, train_data, eval_data, dataclasses.replace(config, max_steps=60))
    print("stopped at step 60; resuming from", training.latest_checkpoint(f"{tmp}/run/checkpoints"))

    model = LogisticWithEmbeddings(schema)  # a fresh process would rebuild the model the same way
    history = training.fit(model, train_data, eval_data, dataclasses.replace(config, resume=True))
    final = history.final_eval
    assert final is not None
    print(f"{history.steps} steps: eval AUC {final['auc']:.4f} (oracle {report.oracle_auc['label']:.4f})")
