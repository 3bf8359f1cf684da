"""Fixtures of the serving tests: a real redis-server on 127.0.0.1 (skipped when the binary is absent) and a
small exported DLRM."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.export import export
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    import redis

    port = free_port()
    workdir: Path = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.skip("redis-server did not start")
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class Toy:
    """A small trained-shape DLRM, exported once per session; helpers to make batches and score them offline.

    Tables: "user" (SUM, 300 rows), "item" (MEAN, 200 rows, features item and last_item): dim 8, 4 dense.
    """

    model: DLRM
    bundle: Path
    features: tuple[str, ...]
    num_dense: int = 4

    def batch(self, b: int, seed: int) -> Batch:
        gen = torch.Generator().manual_seed(seed)
        lists = {}
        for f, rows in (("user", 300), ("item", 200), ("last_item", 200)):
            lengths = torch.randint(0, 4, (b,), generator=gen).tolist()  # empty bags included
            lists[f] = [torch.randint(0, rows, (n,), generator=gen).tolist() for n in lengths]
        dense = torch.randn(b, self.num_dense, generator=gen)
        return Batch(dense, SparseFeatures.from_lists(lists), torch.zeros(b))

    def offline(self, batch: Batch, model: DLRM | None = None) -> np.ndarray:
        m = model or self.model
        with torch.no_grad():
            return torch.sigmoid(m(batch)).numpy()

    def tensors(self, batch: Batch) -> dict[str, np.ndarray]:
        """KServe inputs: dense [B, Dd] and per feature values [N] + lengths [B]."""
        out = {"dense": batch.dense.numpy()}
        for f in self.features:
            j = batch.sparse[f]
            out[f] = j.values.numpy()
            out[f + ".lengths"] = j.lengths.numpy().astype(np.int32)
        return out

    def instances(self, batch: Batch) -> list[dict[str, object]]:
        """/predict instances (already-encoded features)."""
        lists = {f: batch.sparse[f].to_lists() for f in self.features}
        return [
            {"dense": batch.dense[i].tolist(), **{f: lists[f][i] for f in self.features}}
            for i in range(batch.batch_size)
        ]


def make_toy_model(seed: int = 0) -> DLRM:
    torch.manual_seed(seed)
    tables = [
        TableConfig("user", 300, 8),
        TableConfig("item", 200, 8, features=("item", "last_item"), pooling=Pooling.MEAN),
    ]
    return DLRM(EmbeddingCollection(tables), 4, [16, 8], [16, 1]).eval()


@pytest.fixture(scope="session")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Toy:
    model = make_toy_model()
    path = export(model, tmp_path_factory.mktemp("toy") / "bundle", name="toy", version="1")
    return Toy(model, path, ("user", "item", "last_item"))
