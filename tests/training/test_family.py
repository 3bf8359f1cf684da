"""What the families share: each rank's rows of a global batch, the loss share that makes the ranks' mean the
global mean, and gather_rows, whose forward is the ranks' rows in order and whose backward hands each rank the
gradient of the sum over the ranks (checked on 2 gloo processes against one process computing it all)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from hugerec.distributed.launch import spawn
from hugerec.training.family import StepContext, gather_rows, rank_rows, rows_of_ranks, share


@pytest.mark.parametrize(("n", "world"), [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_rank_rows_cover_the_batch_in_order(n: int, world: int) -> None:
    parts = [rank_rows(n, r, world) for r in range(world)]
    assert [i for p in parts for i in range(n)[p]] == list(range(n))
    sizes = [len(range(n)[p]) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_share_turns_a_ranks_mean_into_its_part_of_the_global_mean() -> None:
    sizes = [3, 1]
    losses = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0])]
    ranks_mean = sum(float(loss.mean()) * share(len(loss), sizes) for loss in losses) / len(sizes)
    assert ranks_mean == pytest.approx(float(torch.cat(losses).mean()))
    assert share(5, [5, 5]) == 1.0 and share(0, [0, 0]) == 1.0


def test_one_process_is_the_identity() -> None:
    ctx = StepContext(torch.device("cpu"), torch.Generator())
    x = torch.randn(3, 2, requires_grad=True)
    assert rows_of_ranks(3, ctx) == [3] and gather_rows(x, [3], ctx) is x


def _rank(rank: int, world: int) -> dict[str, Any]:
    ctx = StepContext(torch.device("cpu"), torch.Generator(), rank, world, dist.group.WORLD)
    n = [3, 1][rank]  # unequal parts: the gather pads to the longest
    x = (torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 10 * rank).requires_grad_()
    sizes = rows_of_ranks(n, ctx)
    everything = gather_rows(x, sizes, ctx)
    weights = torch.arange(1, 9, dtype=torch.float32).reshape(4, 2) * (rank + 1)  # each rank's own loss
    (everything * weights).sum().backward()
    ids = gather_rows(torch.tensor([rank] * n), sizes, ctx)  # integers: no graph
    assert x.grad is not None
    return {"sizes": sizes, "gathered": everything.detach(), "grad": x.grad, "ids": ids}


@pytest.mark.slow
def test_gather_rows_on_two_ranks() -> None:
    out = spawn(2, _rank)
    assert out[0]["sizes"] == out[1]["sizes"] == [3, 1]
    whole = torch.cat([torch.arange(6.0).reshape(3, 2), torch.arange(2.0).reshape(1, 2) + 10])
    for r in range(2):
        torch.testing.assert_close(out[r]["gathered"], whole)
        assert out[r]["ids"].tolist() == [0, 0, 0, 1]
    # d(loss_0 + loss_1)/d(row) = weights * (1 + 2), each rank's own rows
    total = torch.arange(1, 9, dtype=torch.float32).reshape(4, 2) * 3
    torch.testing.assert_close(out[0]["grad"], total[:3])
    torch.testing.assert_close(out[1]["grad"], total[3:])
