from pathlib import Path

import numpy as np
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


def write_click_log(path: Path, n: int = 400, sep: str = ",", header: bool = True, seed: int = 0) -> list[dict[str, object]]:
    """A small click log as a user would bring it: user_id, category, tags ("a|b"), price, time
    ("%Y-%m-%d %H:%M:%S", one day of March 2024 per row modulo 28) and clicked (0/1, books clicked more)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for i in range(n):
        category = ["shoes", "books", "games"][int(rng.integers(0, 3))]
        rows.append(
            {
                "user_id": int(rng.integers(1, 40)),
                "category": category,
                "tags": "|".join(sorted({["new", "sale", "top", "eco"][int(k)] for k in rng.integers(0, 4, 2)})),
                "price": round(float(rng.lognormal(2, 1)), 2),
                "time": f"2024-03-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d}:00",
                "clicked": int(rng.random() < (0.7 if category == "books" else 0.2)),
            }
        )
    names = list(rows[0])
    lines = [sep.join(names)] if header else []
    lines += [sep.join(str(r[k]) for k in names) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return rows


@pytest.fixture
def click_log() -> object:
    return write_click_log
