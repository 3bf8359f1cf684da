import pytest
import torch

from hugerec.distributed.comm import CommStats, all_to_all, all_to_all_autograd
from hugerec.distributed.launch import spawn


def _exchange(rank: int, world: int) -> dict[str, object]:
    # rank r sends r + d + 1 rows to rank d (uneven, and some ranks send a zero-row part)
    send = [0 if (rank + d) % 4 == 3 else rank + d + 1 for d in range(world)]
    recv = [0 if (s + rank) % 4 == 3 else s + rank + 1 for s in range(world)]
    x = torch.arange(sum(send) * 2, dtype=torch.float32).view(-1, 2) + 100 * rank  # [n, 2]
    stats = CommStats()
    sync = all_to_all(x, send, recv, stats=stats).wait()
    pending = all_to_all(x, send, recv, stats=stats, tag="async", async_op=True)
    asynced = pending.wait()
    leaf = x.clone().requires_grad_()
    y = all_to_all_autograd(leaf, send, recv, stats=stats, tag="grad")
    (y * torch.arange(1, y.shape[0] + 1, dtype=torch.float32).unsqueeze(1)).sum().backward()
    assert leaf.grad is not None
    with pytest.raises(ValueError, match="sum to"):
        all_to_all(x, [1] * world, recv)
    return {"sync": sync, "async": asynced, "grad": leaf.grad, "stats": stats, "send": send}


def test_uneven_all_to_all_sync_async_and_backward() -> None:
    world = 3
    out = spawn(world, _exchange)
    sends = [o["send"] for o in out]
    for d in range(world):
        # what rank d received: from each source s, that source's rows destined to d, in source order
        want = []
        for s in range(world):
            x = torch.arange(sum(sends[s]) * 2, dtype=torch.float32).view(-1, 2) + 100 * s
            start = sum(sends[s][:d])
            want.append(x[start : start + sends[s][d]])
        assert torch.equal(out[d]["sync"], torch.cat(want))
        assert torch.equal(out[d]["async"], torch.cat(want))
    for s in range(world):
        # gradient of a row = the weight (its 1-based position) it had at its receiver
        grad = out[s]["grad"]
        row = 0
        for d in range(world):
            before = sum(sends[r][d] for r in range(s))  # rows rank d got from lower ranks first
            for i in range(sends[s][d]):
                assert torch.equal(grad[row], torch.full((2,), float(before + i + 1)))
                row += 1
        stats = out[s]["stats"]
        assert isinstance(stats, CommStats)
        to_others = (sum(sends[s]) - sends[s][s]) * 2 * 4
        recv_from_others = sum(sends[r][s] for r in range(world) if r != s) * 2 * 4
        assert stats.by_tag == {
            "all_to_all": to_others,
            "async": to_others,
            "grad": to_others,
            "grad.grad": recv_from_others,
        }
        assert stats.bytes_sent == 3 * to_others + recv_from_others and stats.calls == 4
        assert stats.seconds > 0
