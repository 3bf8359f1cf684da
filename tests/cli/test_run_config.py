from pathlib import Path

import pytest

from hugerec.cli.config_file import ConfigError, read_toml
from hugerec.cli.run_config import QUICKSTART, RawFormat, RunConfig, load_run_config
from hugerec.embedding.optimizers import Adam, RowWiseAdagrad
from hugerec.models.model_config import DCNv2Config, DLRMConfig
from hugerec.training.precision import Precision

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_quickstart_file_spells_out_the_builtin_quickstart() -> None:
    assert read_toml(CONFIGS / "quickstart.toml") == QUICKSTART
    assert load_run_config(CONFIGS / "quickstart.toml") == load_run_config(None)


@pytest.mark.parametrize(
    "name",
    ["quickstart", pytest.param("criteo_sample", marks=pytest.mark.shared_data("criteo/train_examples.txt.gz")), "criteo_kaggle"],
)
def test_every_preset_config_reads(name: str, request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("shared_data") is not None:  # its input is $HUGEREC_DATA/...
        request.getfixturevalue("shared_data")
    cfg = load_run_config(CONFIGS / f"{name}.toml")
    assert isinstance(cfg, RunConfig)
    assert cfg.train.out_dir == f"runs/{name}"


def test_quickstart_defaults_and_typed_overrides() -> None:
    cfg = load_run_config(None, ["train.precision=bf16", "model.top=[32,1]", "embedding.optimizer={type='adam'}"])
    assert cfg.train.precision is Precision.BF16
    assert cfg.model == DLRMConfig(bottom=(64, 16), top=(32, 1))  # merged into the quickstart's [model]
    assert cfg.embedding.optimizer == Adam()
    assert cfg.preprocess.format is RawFormat.PARQUET
    assert load_run_config(None).embedding.optimizer == RowWiseAdagrad(lr=0.03)


def test_a_new_model_type_takes_its_own_fields(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_run_config(None, ["model={type='dcn_v2', deep=[64]}"])
    assert cfg.model == DCNv2Config(deep=(64,))
    # The quickstart's DLRM arches do not fit DCN-v2: switching the type leaves them out, and says so.
    assert load_run_config(None, ["model.type=dcn_v2"]).model == DCNv2Config()
    assert "model.bottom, model.top from the config file do not apply" in capsys.readouterr().err
    # Fields the new type shares are kept; the switch's own fields still apply.
    cfg = load_run_config(None, ["model.type=dcn_v2", "model.deep=[32]"])
    assert cfg.model == DCNv2Config(deep=(32,))
    with pytest.raises(ConfigError, match=r"model\.type: .*unknown type 'dlrn'"):
        load_run_config(None, ["model.type=dlrn"])


def test_defaults_for_a_minimal_file(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text('[data]\ntrain = "shards/train"\n')
    cfg = load_run_config(p)
    assert cfg.train.out_dir == "runs/mine"
    assert cfg.data.schema_path == str(Path("shards/schema.json"))


def test_inputs_are_found_next_to_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "raw.tsv").write_text("")
    p = tmp_path / "conf" / "c.toml"
    p.write_text('[preprocess]\ninput = "raw.tsv"\nout = "out"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config(p)
    assert cfg.preprocess.input == str(tmp_path / "conf" / "raw.tsv")  # not in the cwd, found beside the file
    assert cfg.preprocess.out == "out"  # outputs stay relative to the cwd
    (tmp_path / "raw.tsv").write_text("")
    assert load_run_config(p).preprocess.input == "raw.tsv"  # the cwd comes first


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.lrr=0.1", "unknown key 'train.lrr'; did you mean 'train.lr'?"),
        ("trian.lr=0.1", "unknown key 'trian'; did you mean 'train'?"),
        ("train.epochs=two", "train.epochs: expected an integer, got 'two'"),
        ("train.epochs=0", "train: TrainConfig: epochs must be >= 1, got 0"),
        ("train.precision=fp8", "train.precision: 'fp8' is not one of ['fp32', 'bf16', 'fp16']"),
        ("data.batch_size=0", "data: batch_size must be >= 1, got 0"),
        ("train.out_dir=none", "train.out_dir: give a folder"),
        ("model.dropout=2.0", "model: DLRMConfig: dropout must be in [0, 1), got 2.0"),
    ],
)
def test_mistakes(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_run_config(None, [override])
    assert str(e.value).startswith(message)


def test_dlrm_bottom_must_end_at_the_embedding_width() -> None:
    with pytest.raises(ConfigError, match=r"model\.bottom must end at embedding\.dim = 16 .* e\.g\. model\.bottom=\[512,256,16\]"):
        load_run_config(None, ["model={type='dlrm'}"])
    assert load_run_config(None, ["model={type='dlrm'}", "embedding.dim=64"]).model.bottom == (512, 256, 64)


def test_vector_features_in_the_config(tmp_path: Path) -> None:
    """[[model.vectors]] without a model type amends the default model; its relative path is found
    beside the config; a bad key is named."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "items.parquet").write_bytes(b"")
    config = tmp_path / "cfg" / "run.toml"
    config.write_text(
        '[[model.vectors]]\nname = "item_text"\nfeature = "item_id"\ndim = 8\npath = "items.parquet"\n'
    )
    cfg = load_run_config(config)
    model = cfg.model
    assert type(model).__name__ == "DLRMConfig" and model.bottom == (64, 16)  # the default model's fields
    (feature,) = model.vectors  # type: ignore[union-attr]
    assert (feature.name, feature.feature, feature.dim) == ("item_text", "item_id", 8)
    assert feature.path == str(tmp_path / "cfg" / "items.parquet")
    config.write_text('[[model.vectors]]\nname = "t"\nfeature = "item_id"\ndim = 8\nsize = 3\n')
    with pytest.raises(ConfigError, match=r"unknown key 'model.vectors\[0\].size'; known keys: dim, feature"):
        load_run_config(config)
