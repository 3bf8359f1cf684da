"""HbmCache: a table in host memory trained through cache slots ends equal to the same table trained in
place; hits, misses, reads and write-backs follow least-recently-used by batch; pinned batches are never
evicted. Without CUDA the copy kernel runs under Triton's interpreter on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from hugerec.embedding.hbm_cache import HbmCache

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class BatchLru:
    """The contract in plain Python: distinct rows per batch; misses take the least recently used slot
    (by batch stamp, then slot index) that the last `pinned` batches did not use."""

    def __init__(self, slots: int, pinned: int) -> None:
        self.slot_of: dict[int, int] = {}
        self.stamp = [-1] * slots
        self.row = [-1] * slots
        self.dirty = [False] * slots
        self.pinned = pinned
        self.clock = 0
        self.counts = {"hits": 0, "misses": 0, "rows_read": 0, "rows_written": 0}

    def prepare(self, rows: list[int], update: bool) -> list[int]:
        self.clock += 1
        wanted = sorted(set(r for r in rows if r >= 0))
        misses = [r for r in wanted if r not in self.slot_of]
        self.counts["hits"] += len(wanted) - len(misses)
        self.counts["misses"] += len(misses)
        for r in wanted:
            if r in self.slot_of:
                self.stamp[self.slot_of[r]] = self.clock
        free = sorted(
            (s for s in range(len(self.stamp)) if self.stamp[s] <= self.clock - self.pinned),
            key=lambda s: (max(self.stamp[s], 0), s),
        )
        if len(free) < len(misses):
            raise ValueError("full")
        for r, s in zip(misses, free, strict=False):
            if self.row[s] >= 0:
                self.counts["rows_written"] += self.dirty[s]
                del self.slot_of[self.row[s]]
            self.slot_of[r], self.row[s], self.stamp[s], self.dirty[s] = s, r, self.clock, False
            self.counts["rows_read"] += 1
        if update:
            for r in wanted:
                self.dirty[self.slot_of[r]] = True
        return [self.slot_of[r] if r >= 0 else -1 for r in rows]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_through_the_cache_equals_training_in_place(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    rows, dim, slots = 40, 8, 12
    weight = torch.randn(rows, dim).to(dtype)
    state = torch.rand(rows, 1)
    plain_w, plain_s = weight.clone(), state.clone()
    cache = HbmCache(weight.clone(), state.clone(), slots, DEVICE)
    ref = BatchLru(slots, cache.pinned)
    for step in range(12):
        batch = (rng.zipf(1.3, size=6) - 1) % rows
        batch[0] = -1 if step % 4 == 0 else batch[0]
        ids = torch.tensor(batch, dtype=torch.int64)
        got = cache.prepare(ids.to(DEVICE), missing_ok=True)
        want = ref.prepare(batch.tolist(), update=True)
        assert got.cpu().tolist() == want
        touched = ids[ids >= 0].unique()
        slots_of = cache.slot_of_row[touched.to(DEVICE)]
        # a training step on the slots, and the same step on the plain table
        cache.weight[slots_of] = (cache.weight[slots_of].float() + step).to(dtype)
        cache.state[slots_of] += 1.0
        plain_w[touched] = (plain_w[touched].float() + step).to(dtype)
        plain_s[touched] += 1.0
    assert {k: int(v) for k, v in cache.stats().items() if k != "hit_rate"} == ref.counts
    cache.flush()
    assert torch.equal(cache.host_weight, plain_w)
    assert torch.equal(cache.host_state, plain_s)


def test_the_last_batches_are_pinned_and_bad_rows_are_named() -> None:
    cache = HbmCache(torch.zeros(10, 4), torch.zeros(10, 0), 4, DEVICE)
    cache.prepare(torch.tensor([0, 1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="only 1 of 4 slots"):  # batch 1's three slots are pinned at batch 2
        cache.prepare(torch.tensor([3, 4], device=DEVICE))
    assert cache.prepare(torch.tensor([3], device=DEVICE)).tolist() == [3]
    with pytest.raises(ValueError, match="row 10 is outside"):
        cache.prepare(torch.tensor([1, 10], device=DEVICE))
    with pytest.raises(ValueError, match="row -1 is outside"):
        cache.prepare(torch.tensor([-1], device=DEVICE))


def test_copy_kernel_compiles_for_hopper() -> None:
    from tests.ops.gpu.conftest import compile_for_hopper

    sig = {
        "src_address": "i64",
        "src_stride": "i64",
        "src_rows": "*i64",
        "dst_address": "i64",
        "dst_stride": "i64",
        "dst_rows": "*i64",
        "n": "i32",
        "words": "i32",
        "BLOCK_R": "constexpr",
        "BLOCK_W": "constexpr",
    }
    compile_for_hopper(
        [("hugerec.ops.gpu.row_cache_kernels", "_copy_rows_kernel", sig, {"BLOCK_R": 8, "BLOCK_W": 128})]
    )
