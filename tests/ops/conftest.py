"""Random lookup problems for the kernel-vs-reference tests (shared by tests/ops and tests/ops/cpu)."""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
import torch

from hugerec.ops.lookup_plan import WIDTH


@dataclass
class Case:
    """One table group serving some features of a batch, plus an extra feature it does not serve."""

    weight: torch.Tensor  # [R, D_pad]
    values: torch.Tensor  # [N] int64
    offsets: torch.Tensor  # [F*B + 1] int64
    per_sample_weights: torch.Tensor | None
    plan: torch.Tensor  # [F_g, 7]
    dim: int
    batch: int
    columns: int  # pooled output width (a few unused columns in front)
    sequence_plan: torch.Tensor  # the same lines with COLUMN = first output row (features back to back)
    sequence_rows: int  # N_g: ids of the served features


def draw_case(
    data: st.DataObject,
    dtype: torch.dtype = torch.float32,
    invalid: bool = False,
    mean: bool | None = None,
) -> Case:
    """Tables of 1..12 rows (dim 1..17), 1..2 features each, B = 1..4 bags of 0..4 ids (or of exactly one id
    for some features), duplicates likely."""
    dim = data.draw(st.sampled_from([1, 3, 4, 8, 17]), "dim")
    batch = data.draw(st.integers(1, 4), "batch")
    num_tables = data.draw(st.integers(1, 3), "tables")
    weighted = data.draw(st.booleans(), "weighted")
    lines, row_offset, column = [], 0, data.draw(st.integers(0, 3), "first column")
    feature = 1  # feature 0 belongs to no table of the group: its ids must be ignored
    for t in range(num_tables):
        num_rows = data.draw(st.integers(1, 12), "num_rows")
        is_mean = data.draw(st.booleans(), "mean") if mean is None else mean
        missing_ok = data.draw(st.booleans(), "missing_ok")
        for _ in range(data.draw(st.integers(1, 2), "features")):
            lines.append([feature, t, row_offset, num_rows, column, int(is_mean), int(missing_ok)])
            feature, column = feature + 1, column + dim
        row_offset += num_rows
    if data.draw(st.booleans(), "shuffle"):
        lines = data.draw(st.permutations(lines), "order")
    num_features = feature
    lengths = []
    for _ in range(num_features):  # some features one id per bag (the kernels' one-hot path), others ragged
        if data.draw(st.booleans(), "one id per bag"):
            lengths += [1] * batch
        else:
            lengths += data.draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch), "lengths")
    ids: list[int] = []
    by_feature = {line[0]: line for line in lines}
    for f in range(num_features):
        n = sum(lengths[f * batch : (f + 1) * batch])
        if f not in by_feature:
            ids += data.draw(st.lists(st.integers(-5, 10**6), min_size=n, max_size=n), "ignored ids")
            continue
        num_rows, missing_ok = by_feature[f][3], by_feature[f][6]
        low = -1 if missing_ok else 0
        choices = st.integers(low, num_rows - 1)
        if invalid:
            choices = st.one_of(choices, st.sampled_from([-2, -1, num_rows, num_rows + 7]))
        ids += data.draw(st.lists(choices, min_size=n, max_size=n), "ids")
    offsets = torch.zeros(num_features * batch + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    seed = data.draw(st.integers(0, 2**31 - 1), "seed")
    gen = torch.Generator().manual_seed(seed)
    per16 = 16 // torch.tensor([], dtype=dtype).element_size()
    weight = torch.randn(row_offset, -(-dim // per16) * per16, generator=gen).to(dtype)
    psw = torch.rand(len(ids), generator=gen) * 4 - 2 if weighted else None
    plan = torch.tensor(lines, dtype=torch.int64).view(-1, WIDTH)
    sequence_lines, served = [], 0
    for line in lines:
        sequence_lines.append([*line[:4], served, *line[5:]])
        served += int(offsets[(line[0] + 1) * batch] - offsets[line[0] * batch])
    sequence_plan = torch.tensor(sequence_lines, dtype=torch.int64).view(-1, WIDTH)
    values = torch.tensor(ids, dtype=torch.int64)
    return Case(weight, values, offsets, psw, plan, dim, batch, column, sequence_plan, served)


@pytest.fixture(scope="session")
def make_case():  # type: ignore[no-untyped-def]
    return draw_case
