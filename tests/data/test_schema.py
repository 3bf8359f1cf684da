from pathlib import Path

import pytest

from hugerec.data.schema import Column, ColumnKind, DimRule, Schema, ValueType
from hugerec.embedding.table_config import Pooling


def _schema() -> Schema:
    return Schema.build(
        dense=["age", "price"],
        sparse={"user": 1000, "item": 5000, "last_items": 5000, "country": 3},
        multi_hot=["last_items"],
        tables={"last_items": "item"},
    )


def test_views_and_defaults() -> None:
    s = _schema()
    assert s.label_names == ("label",)
    assert s.dense_names == ("age", "price")
    assert s.sparse_names == ("user", "item", "last_items", "country")
    assert s["last_items"].multi_hot and s["last_items"].table_name == "item"
    assert s["age"].dtype is ValueType.FLOAT and s["user"].dtype is ValueType.INT
    assert "age" in s and "nope" not in s
    with pytest.raises(KeyError, match="nope"):
        s["nope"]


def test_table_configs_default_rule_shared_tables_and_overrides() -> None:
    tables = _schema().table_configs()
    by_name = {t.name: t for t in tables}
    assert list(by_name) == ["user", "item", "country"]
    assert by_name["item"].features == ("item", "last_items")
    assert by_name["item"].num_rows == 5000
    rule = DimRule()
    assert by_name["user"].dim == rule(1000) and by_name["user"].dim % 8 == 0
    assert by_name["country"].dim == 16  # the minimum
    same = _schema().table_configs(dim=32, dims={"user": 8}, pooling=Pooling.MEAN)
    assert [t.dim for t in same] == [8, 32, 32]
    assert all(t.pooling is Pooling.MEAN for t in same)


def test_dim_rule_values() -> None:
    rule = DimRule()
    assert rule(3) == 16
    assert rule(1460) == 120  # 2 * 1460 ** 0.56 = 118.4 -> 120
    assert rule(10_000_000) == 512
    assert DimRule(multiplier=1.0, exponent=0.5, minimum=1, maximum=1000, multiple=1)(100) == 10
    with pytest.raises(ValueError, match="minimum"):
        DimRule(minimum=64, maximum=32)


def test_table_configs_errors() -> None:
    with pytest.raises(ValueError, match="'C1' has no cardinality"):
        Schema.criteo().table_configs()
    with pytest.raises(ValueError, match="unknown tables"):
        _schema().table_configs(dims={"ghost": 8})
    with pytest.raises(ValueError, match="positive int"):
        _schema().table_configs(dim=0)


def test_json_round_trip(tmp_path: Path) -> None:
    s = _schema()
    assert Schema.from_json(s.to_json()) == s
    s.save(tmp_path / "schema.json")
    assert Schema.load(tmp_path / "schema.json") == s
    c = Schema.criteo({"C1": 10})
    assert Schema.from_json(c.to_json()) == c
    (tmp_path / "bad.json").write_text('{"columns": [{"name": "x", "kind": "weird"}]}')
    with pytest.raises(ValueError, match=r"bad\.json.*'weird' is not one of"):
        Schema.load(tmp_path / "bad.json")


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="at least one label"):
        Schema((Column("x", ColumnKind.DENSE),))
    with pytest.raises(ValueError, match="duplicate column names"):
        Schema.build(dense=["a", "a"])
    with pytest.raises(ValueError, match="cardinality must be a positive int"):
        Column("c", ColumnKind.SPARSE, cardinality=0)
    with pytest.raises(ValueError, match="for sparse columns"):
        Column("d", ColumnKind.DENSE, cardinality=5)
    with pytest.raises(ValueError, match="different cardinalities"):
        Schema.build(sparse={"a": 5, "b": 6}, tables={"b": "a"})
    with pytest.raises(ValueError, match="not sparse columns"):
        Schema.build(sparse={"a": 5}, multi_hot=["b"])
    with pytest.raises(ValueError, match=r"\['I1'\] are not sparse"):
        Schema.criteo().with_cardinalities({"I1": 3})
    with pytest.raises(ValueError, match="unknown keys"):
        Column.from_dict({"name": "x", "kind": "label", "colour": "red"})


def test_criteo_layout_and_select() -> None:
    s = Schema.criteo()
    assert len(s) == 40
    assert s.dense_names[0] == "I1" and s.sparse_names[-1] == "C26"
    assert s["C3"].dtype is ValueType.HEX
    small = s.select(["label", "I1", "C1"])
    assert small.names == ("label", "I1", "C1")
    assert "C1" in str(small)
