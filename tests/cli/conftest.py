from pathlib import Path

import pytest

from hugerec.cli.run_config import RunConfig, load_run_config

TINY = [
    "synth.rows=6000",
    "data.batch_size=512",
    "train.progress=false",
    "train.tensorboard=false",
    "train.log_every=2",
]


@pytest.fixture
def tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunConfig:
    """The quickstart shrunk to seconds, running in a temporary directory."""
    monkeypatch.chdir(tmp_path)
    return load_run_config(None, TINY)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the tiny quickstart's synth + preprocess already ran (shared by the tests that train)."""
    from hugerec.cli.commands import preprocess, synth

    root = tmp_path_factory.mktemp("prepared")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        cfg = load_run_config(None, TINY)
        synth(cfg)
        preprocess(cfg)
    return root
