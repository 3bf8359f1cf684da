import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.grouping import Agg, Groupby
from hugerec.data.preprocess.op import ROW_ID


def test_groupby_lists_in_time_order_matches_pandas():
    rng = np.random.default_rng(1)
    frame = pl.DataFrame(
        {
            "user": rng.integers(0, 6, 80),
            "ts": rng.permutation(80),
            "item": rng.integers(0, 30, 80),
            "w": rng.random(80),
        }
    ).with_columns(pl.Series(ROW_ID, np.arange(80, dtype=np.uint64)))
    op = Groupby("user", {"item": ["list", "last", "count"], "w": Agg.MEAN}, sort_by="ts", max_list_length=5)
    out = op.transform(frame, {})
    assert out.columns == ["user", "item_list", "item_last", "item_count", "w_mean"]
    df = frame.to_pandas().sort_values(["user", "ts"])
    grouped = df.groupby("user")
    assert out["user"].to_list() == sorted(grouped.groups)
    assert out["item_list"].to_list() == [g["item"].tolist()[-5:] for _, g in grouped]
    assert out["item_last"].to_list() == grouped["item"].last().tolist()
    assert out["item_count"].to_list() == grouped["item"].count().tolist()
    np.testing.assert_allclose(out["w_mean"].to_numpy(), grouped["w"].mean().to_numpy())


def test_groupby_config_is_validated():
    assert Groupby("s", [("a", "sum"), ("a", "max")]).aggregations == (("a", Agg.SUM), ("a", Agg.MAX))
    with pytest.raises(ValueError, match="non-empty and distinct"):
        Groupby("s", {})
    with pytest.raises(ValueError, match="clash"):
        Groupby(["s", "a_sum"], {"a": "sum"})
    with pytest.raises(ValueError, match="max_list_length"):
        Groupby("s", {"a": "list"}, max_list_length=0)
