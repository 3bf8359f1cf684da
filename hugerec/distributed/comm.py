"""all_to_all with uneven splits over `all_to_all_single`, sync or async, differentiable, and counted.

    rank r sends input[sum(send_splits[:d]) : sum(send_splits[:d+1])] to rank d and receives
    recv_splits[s] rows from rank s, stacked in rank order.

Only `all_to_all_single` is used: it takes uneven splits on gloo and NCCL alike, while gloo's
list form `all_to_all` fails for unequal sizes. Splits count rows of dim 0; trailing dims must
agree on both sides (callers flatten to 1-D when they do not).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


@dataclass
class CommStats:
    """Bytes this rank sent to other ranks (its own share excluded) and seconds spent waiting on them."""

    bytes_sent: int = 0
    seconds: float = 0.0
    calls: int = 0
    by_tag: dict[str, int] = field(default_factory=dict)

    def add(self, tag: str, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.calls += 1
        self.by_tag[tag] = self.by_tag.get(tag, 0) + nbytes

    def reset(self) -> None:
        self.bytes_sent, self.seconds, self.calls = 0, 0.0, 0
        self.by_tag.clear()


def _bytes_to_others(t: torch.Tensor, send_splits: Sequence[int], rank: int) -> int:
    row = math.prod(t.shape[1:]) * t.element_size()
    return (sum(send_splits) - send_splits[rank]) * row


@dataclass
class Pending:
    """An all_to_all in flight: `wait()` returns its output."""

    output: torch.Tensor
    work: Any
    stats: CommStats | None

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            t0 = time.perf_counter()
            self.work.wait()
            if self.stats is not None:
                self.stats.seconds += time.perf_counter() - t0
            self.work = None
        return self.output


def all_to_all(
    input: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    group: ProcessGroup | None = None,
    stats: CommStats | None = None,
    tag: str = "all_to_all",
    async_op: bool = False,
) -> Pending:
    """Start (async_op) or run an uneven all_to_all; `.wait()` on the result gives [sum(recv_splits), ...]."""
    send, recv = [int(s) for s in send_splits], [int(s) for s in recv_splits]
    if sum(send) != input.shape[0]:
        raise ValueError(f"all_to_all({tag}): send splits {send} sum to {sum(send)}, input has {input.shape[0]} rows")
    input = input.contiguous()
    output = input.new_empty((sum(recv), *input.shape[1:]))
    rank = dist.get_rank(group)
    if stats is not None:
        stats.add(tag, _bytes_to_others(input, send, rank))
    t0 = time.perf_counter()
    work = dist.all_to_all_single(output, input, recv, send, group=group, async_op=async_op)
    if not async_op and stats is not None:
        stats.seconds += time.perf_counter() - t0
    return Pending(output, work if async_op else None, stats)


class _AllToAllFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        send: list[int],
        recv: list[int],
        group: ProcessGroup | None,
        stats: CommStats | None,
        tag: str,
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.stats, ctx.tag = send, recv, group, stats, tag
        return all_to_all(input, send, recv, group, stats, tag).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # The transpose of an all_to_all is the all_to_all with the splits swapped.
        back = all_to_all(grad, ctx.recv, ctx.send, ctx.group, ctx.stats, ctx.tag + ".grad").wait()
        return back, None, None, None, None, None


def all_to_all_autograd(
    input: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    group: ProcessGroup | None = None,
    stats: CommStats | None = None,
    tag: str = "all_to_all",
) -> torch.Tensor:
    """all_to_all whose backward sends the gradients back the way the values came."""
    out: torch.Tensor = _AllToAllFn.apply(input, list(send_splits), list(recv_splits), group, stats, tag)
    return out
