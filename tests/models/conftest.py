"""A tiny learnable task shared by the model tests: labels from hidden per-id scores and the dense features."""

import pytest
import torch
from torch import nn

from hugerec.embedding.table_config import TableConfig
from hugerec.models.model import RecModel
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


class Task:
    num_tables = 3
    num_rows = 50
    num_dense = 4

    def tables(self, dim: int = 8, prefix: str = "t") -> list[TableConfig]:
        return [TableConfig(f"{prefix}{i}", num_rows=self.num_rows, dim=dim) for i in range(self.num_tables)]

    def batches(self, num_batches: int, batch_size: int, seed: int = 0, ids_per_bag: int = 2) -> list[Batch]:
        """Label = 1 when the hidden scores of the example's ids plus a dense term are positive."""
        g = torch.Generator().manual_seed(seed)
        scores = torch.randn(self.num_tables, self.num_rows, generator=torch.Generator().manual_seed(1234))
        w_dense = torch.tensor([1.0, -1.0, 0.5, 0.0])
        out = []
        for _ in range(num_batches):
            ids = torch.randint(0, self.num_rows, (self.num_tables, batch_size, ids_per_bag), generator=g)
            dense = torch.randn(batch_size, self.num_dense, generator=g)
            logit = dense @ w_dense
            for t in range(self.num_tables):
                logit = logit + scores[t][ids[t]].sum(dim=1)
            sparse = SparseFeatures.from_dense({f"t{t}": ids[t] for t in range(self.num_tables)})
            out.append(Batch(dense, sparse, (logit > 0).float()))
        return out

    def train(self, model: RecModel, batches: list[Batch], epochs: int, lr: float = 1e-2) -> list[float]:
        """Mean BCE loss per epoch (dense Adam; the embeddings update themselves in backward)."""
        opt = torch.optim.Adam(model.dense_parameters(), lr=lr)
        losses = []
        for _ in range(epochs):
            total = 0.0
            for batch in batches:
                loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item()
            losses.append(total / len(batches))
        return losses


@pytest.fixture
def task() -> Task:
    torch.manual_seed(0)
    return Task()
