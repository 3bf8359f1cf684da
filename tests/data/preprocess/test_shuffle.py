from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.dataset import Dataset
from hugerec.data.preprocess.grouping import Groupby
from hugerec.data.preprocess.shuffle import repartition
from hugerec.data.preprocess.temporal import DifferenceLag
from hugerec.data.preprocess.workflow import Workflow


def _events(n: int = 600) -> pl.DataFrame:
    rng = np.random.default_rng(2)
    return pl.DataFrame(
        {"user": rng.integers(0, 40, n), "ts": rng.permutation(n), "item": rng.integers(0, 90, n).astype(str)}
    )


def test_every_key_lands_in_one_sorted_file(tmp_path: Path):
    events = _events()
    inputs = Dataset.from_frames(events[:200], events[200:450], events[450:])
    out = repartition(inputs, "user", tmp_path / "rp", num_partitions=4, sort_by="ts", engine=1)
    assert out.partitioned_by == ("user",) and len(out.partitions()) == 4
    files = [pl.read_parquet(p.path) for p in out.partitions()]
    users = [set(f["user"].to_list()) for f in files]
    assert sum(len(u) for u in users) == len(set().union(*users)) == events["user"].n_unique()
    for f in files:
        assert f.equals(f.sort(["user", "ts"]))
    assert pl.concat(files).sort("ts").equals(events.sort("ts"))
    assert not (tmp_path / "rp" / "_shuffle").exists()
    with pytest.raises(ValueError, match="already holds part files"):
        repartition(inputs, "user", tmp_path / "rp", num_partitions=2, engine=1)
    with pytest.raises(ValueError, match="unknown column"):
        repartition(inputs, "nope", tmp_path / "rp2", num_partitions=2, engine=1)


def test_group_ops_over_a_repartitioned_dataset_equal_the_whole(tmp_path: Path):
    events = _events()
    inputs = Dataset.from_frames(events[:300], events[300:])
    ops = [
        Categorify("item"),
        DifferenceLag("ts", group_by="user", sort_by="ts"),
        Groupby("user", {"item": "list", "ts_lag1": "max"}, sort_by="ts"),
    ]
    with pytest.raises(ValueError, match="needs every group in one partition"):
        Workflow(ops).fit(inputs, engine=1)
    shuffled = repartition(inputs, "user", tmp_path / "rp", num_partitions=3, engine=1)
    wf = Workflow(ops).fit(shuffled, engine=1)
    got = pl.read_parquet(wf.transform(shuffled, tmp_path / "out", engine=1).paths).sort("user")
    whole = Workflow(ops).fit(events)
    assert got.equals(whole.transform_frame(events).sort("user"))
    assert wf.cardinalities() == {"item_list": 2 + events["item"].n_unique()}
