import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adam, Optimizer
from hugerec.embedding.table_config import TableConfig
from hugerec.models.hstu import HSTU
from hugerec.models.sequence import SequenceConfig
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.checkpoint import list_checkpoints, load_checkpoint
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.precision import Precision
from hugerec.training.schedule import Schedule
from hugerec.training.trainer import DenseOptimizer, TrainConfig, evaluate, fit, predict

NUM_IDS = 40


class TinyModel(nn.Module):
    """Dense + one pooled id feature -> MLP with dropout -> logits [B] (dropout makes the RNG matter)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.EmbeddingBag(NUM_IDS, 8, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(8 + 3, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, batch: Batch) -> torch.Tensor:
        f = batch.sparse["item"]
        pooled = self.emb(f.values, f.offsets()[:-1])  # [B, 8]
        return self.mlp(torch.cat([batch.dense, pooled], dim=1)).squeeze(1)  # [B, 11] -> [B]


def make_batches(num_batches: int, batch_size: int = 64, seed: int = 0) -> list[Batch]:
    """Labels from a hidden logistic model over the dense features and the item id."""
    g = torch.Generator().manual_seed(seed)
    item_effect = torch.randn(NUM_IDS, generator=g) * 2
    out = []
    for _ in range(num_batches):
        dense = torch.randn(batch_size, 3, generator=g)
        items = torch.randint(0, NUM_IDS, (batch_size,), generator=g)
        logit = dense[:, 0] * 1.5 - dense[:, 1] + item_effect[items]
        labels = (torch.rand(batch_size, generator=g) < torch.sigmoid(logit)).float()
        sparse = SparseFeatures.from_dense({"item": items})
        out.append(Batch(dense, sparse, labels))
    return out


class ShufflingLoader:
    """A resumable loader like hugerec's: reshuffles every epoch from (seed, epoch), position in state_dict."""

    def __init__(self, batches: list[Batch], seed: int = 7) -> None:
        self.batches, self.seed, self.epoch, self.position = batches, seed, 0, 0

    def __iter__(self) -> Iterator[Batch]:
        if self.position >= len(self.batches):  # as hugerec's Loader: a finished epoch moves on to the next
            self.epoch, self.position = self.epoch + 1, 0
        order = torch.randperm(len(self.batches), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        while self.position < len(order):
            i = int(order[self.position])
            self.position += 1
            yield self.batches[i]
        self.epoch, self.position = self.epoch + 1, 0

    def __len__(self) -> int:
        return len(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def quiet(**kw: Any) -> TrainConfig:
    return TrainConfig(progress=False, tensorboard=False, plot=False, **kw)


def test_fit_learns_and_writes_its_outputs(tmp_path: Path) -> None:
    train, valid = make_batches(40), make_batches(10, seed=1)
    model = TinyModel()
    cfg = TrainConfig(epochs=2, lr=0.02, eval_every=25, log_every=10, out_dir=str(tmp_path), progress=False)
    history = fit(model, train, valid, cfg)
    assert history.steps == 80
    assert [r["step"] for r in history.evals] == [25, 50, 75, 80]  # every 25 steps and at the end
    assert history.final_eval is not None and history.final_eval["auc"] > 0.75
    assert history.train[-1]["loss"] < history.train[0]["loss"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "eval"}
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert any((tmp_path / "tensorboard").iterdir())
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [80]
    assert evaluate(model, valid)["auc"] == pytest.approx(history.final_eval["auc"])
    probs = torch.cat(list(predict(model, valid)))
    assert probs.shape == (640,) and float(probs.min()) >= 0 and float(probs.max()) <= 1


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("loader", ["list", "stateful"])
@pytest.mark.parametrize("first_steps", [7, 10])  # stop mid-epoch, and right after an epoch's last batch
def test_resume_is_exact(tmp_path: Path, loader: str, first_steps: int) -> None:
    """N steps + resume + M steps == N + M steps, bitwise, across epoch boundaries, with dropout and eval."""
    batches = make_batches(5)

    def data() -> Any:
        return list(batches) if loader == "list" else ShufflingLoader(batches)

    kw: dict[str, Any] = {"epochs": 3, "lr": 0.01, "schedule": Schedule(warmup_steps=3, decay_start=4, decay_steps=20)}
    whole = TinyModel()
    expected = fit(whole, data(), batches[:2], quiet(out_dir=str(tmp_path / "whole"), **kw))
    assert expected.steps == 15 and [r["step"] for r in expected.evals] == [5, 10, 15]

    part = TinyModel()
    run = str(tmp_path / "part")
    first = fit(part, data(), batches[:2], quiet(max_steps=first_steps, out_dir=run, checkpoint_every=3, **kw))
    assert first.steps == first_steps
    assert [s for s, _ in list_checkpoints(Path(run) / "checkpoints")][-1] == first_steps
    resumed = TinyModel(seed=123)  # different init: everything must come from the checkpoint
    second = fit(resumed, data(), batches[:2], quiet(out_dir=run, resume=True, **kw))
    assert second.steps == 15
    # the interrupted run also evaluated where it stopped; every scheduled evaluation matches
    got = {r["step"]: r["auc"] for r in second.evals}
    assert sorted(got) == sorted({5.0, 10.0, 15.0, float(first_steps)})
    assert all(got[r["step"]] == r["auc"] for r in expected.evals)
    a, b = weights(whole), weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_after_the_last_step_does_nothing_more(tmp_path: Path) -> None:
    model = TinyModel()
    cfg = quiet(epochs=3, max_steps=4, out_dir=str(tmp_path), resume=True)
    fit(model, make_batches(3), None, cfg)
    before = weights(model)
    again = fit(model, make_batches(3), None, cfg)
    assert again.steps == 4
    assert all(torch.equal(before[k], v) for k, v in weights(model).items())


def test_schedule_drives_the_dense_lr() -> None:
    cfg = quiet(lr=0.1, optimizer=DenseOptimizer.SGD, log_every=1, schedule=Schedule(warmup_steps=4))
    history = fit(TinyModel(), make_batches(6), None, cfg)
    assert [r["lr"] for r in history.train] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


class SparseTinyModel(nn.Module):
    """TinyModel with a hugerec EmbeddingCollection: the id rows are updated by a sparse optimizer in backward."""

    def __init__(self, optimizer: Optimizer, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = EmbeddingCollection([TableConfig("ids", NUM_IDS, 8, ("item",))], optimizer)
        self.mlp = nn.Sequential(nn.Linear(8 + 3, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def dense_parameters(self) -> Iterator[nn.Parameter]:  # what the dense optimizer updates (a hugerec model's method)
        return self.mlp.parameters()

    def rows(self) -> torch.Tensor:
        return self.emb.state_dict()["tables.ids.weight"].clone()

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.emb(batch.sparse).values  # [B, 8]
        return self.mlp(torch.cat([batch.dense, pooled], dim=1)).squeeze(1)  # [B, 11] -> [B]


def test_a_sparse_schedule_scales_the_rows_update() -> None:
    """Schedule(sparse=True): the first step's factor (1/4 of warmup) reaches the sparse SGD update: the rows
    move as with a sparse lr of a quarter (bitwise), a quarter as far as without sparse; fit leaves the
    tables at their own lr."""
    batches = make_batches(1)
    moved = {}
    for name, opt, sparse in (("scaled", SGD(lr=0.5), True), ("reference", SGD(lr=0.125), False), ("dense only", SGD(lr=0.5), False)):
        model = SparseTinyModel(opt)
        before = model.rows()
        fit(model, list(batches), None, quiet(epochs=1, lr=0.01, schedule=Schedule(warmup_steps=4, sparse=sparse)))
        moved[name] = model.rows() - before
        assert model.emb._fused.lr_scale == 1.0
    assert moved["reference"].abs().sum() > 0
    assert torch.equal(moved["scaled"], moved["reference"])
    torch.testing.assert_close(moved["dense only"] * 0.25, moved["scaled"])


@pytest.mark.parametrize("first_steps", [7, 10])
def test_resume_is_exact_with_a_sparse_schedule(tmp_path: Path, first_steps: int) -> None:
    """N steps + resume + M steps == N + M steps, bitwise, with the schedule on the sparse Adam's lr too."""
    batches = make_batches(5)
    schedule = Schedule(warmup_steps=3, decay_start=4, decay_steps=20, sparse=True)
    kw: dict[str, Any] = {"epochs": 3, "lr": 0.01, "schedule": schedule}
    whole = SparseTinyModel(Adam(lr=0.05))
    fit(whole, ShufflingLoader(batches), None, quiet(out_dir=str(tmp_path / "whole"), **kw))
    run = str(tmp_path / "part")
    first = fit(SparseTinyModel(Adam(lr=0.05)), ShufflingLoader(batches), None, quiet(max_steps=first_steps, out_dir=run, checkpoint_every=3, **kw))
    assert first.steps == first_steps
    resumed = SparseTinyModel(Adam(lr=0.05), seed=123)
    assert fit(resumed, ShufflingLoader(batches), None, quiet(out_dir=run, resume=True, **kw)).steps == 15
    a, b = weights(whole), weights(resumed)
    assert a.keys() == b.keys() and "emb.tables.ids.exp_avg" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the same run with the dense lr alone scheduled ends elsewhere: the factor did reach the rows
    dense_only = SparseTinyModel(Adam(lr=0.05))
    fit(dense_only, ShufflingLoader(batches), None, quiet(epochs=3, lr=0.01, schedule=Schedule(warmup_steps=3, decay_start=4, decay_steps=20)))
    assert not torch.equal(weights(dense_only)["emb.tables.ids.weight"], a["emb.tables.ids.weight"])
    with pytest.raises(ValueError, match=r"schedule\.sparse"):  # a resumed run that changes it is refused
        fit(SparseTinyModel(Adam(lr=0.05)), ShufflingLoader(batches), None, quiet(out_dir=run, resume=True, **{**kw, "schedule": Schedule(warmup_steps=3, decay_start=4, decay_steps=20)}))


def test_gradient_clipping_bounds_the_update() -> None:
    model = TinyModel()
    before = weights(model)
    fit(model, make_batches(3), None, quiet(lr=1.0, optimizer=DenseOptimizer.SGD, clip_grad_norm=1e-3))
    after = weights(model)
    dense = [k for k in before if k.startswith("mlp")]
    moved = torch.sqrt(sum(((after[k] - before[k]) ** 2).sum() for k in dense))  # type: ignore[arg-type]
    assert 0 < float(moved) <= 3 * 1e-3 * 1.0001  # 3 SGD steps of lr 1 with |g| <= 1e-3


def test_bf16_autocast_on_cpu() -> None:
    history = fit(TinyModel(), make_batches(8), make_batches(2, seed=1), quiet(precision=Precision.BF16, lr=0.02))
    assert history.final_eval is not None and 0.0 <= history.final_eval["auc"] <= 1.0


def test_user_supplied_optimizer() -> None:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fit(model, make_batches(3), None, quiet(), optimizer=opt)
    assert opt.state  # momentum buffers exist: the given optimizer did the steps


class NanModel(TinyModel):
    def forward(self, batch: Batch) -> torch.Tensor:
        return super().forward(batch) * float("nan")


class WrongShape(TinyModel):
    def forward(self, batch: Batch) -> torch.Tensor:
        return super().forward(batch).unsqueeze(1)


def test_errors() -> None:
    with pytest.raises(ValueError, match="yielded no batches"):
        fit(TinyModel(), [], None, quiet())
    with pytest.raises(ValueError, match="evaluation data yielded no examples"):
        evaluate(TinyModel(), [])
    with pytest.raises(ValueError, match=r"logits of shape \(64, 1\) for labels of shape \(64,\)"):
        fit(WrongShape(), make_batches(1), None, quiet())
    with pytest.raises(FloatingPointError, match="diverged"):
        fit(NanModel(), make_batches(2), None, quiet(log_every=1))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
            fit(TinyModel(), make_batches(1), None, quiet(precision=Precision.FP16))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epochs": 0}, "epochs"),
        ({"max_steps": 0}, "max_steps"),
        ({"lr": 0.0}, "lr"),
        ({"checkpoint_every": 10}, "out_dir"),
        ({"resume": True}, "out_dir"),
        ({"device": "tpu9"}, "unknown device 'tpu9'"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_config_accepts_enum_values_as_strings() -> None:
    cfg = TrainConfig(precision="bf16", optimizer="sgd")  # type: ignore[arg-type]
    assert cfg.precision is Precision.BF16 and cfg.optimizer is DenseOptimizer.SGD


def test_a_fresh_run_replaces_an_old_runs_outputs(tmp_path: Path) -> None:
    fit(TinyModel(), make_batches(6), None, quiet(out_dir=str(tmp_path), checkpoint_every=2, log_every=1))
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [2, 4, 6]
    fit(TinyModel(), make_batches(3), None, quiet(out_dir=str(tmp_path), log_every=1))
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [3]  # step 6 would pose as the latest
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", [Precision.FP16, Precision.BF16])
def test_mixed_precision_on_cuda(precision: Precision) -> None:
    history = fit(TinyModel(), make_batches(8), make_batches(2, seed=1), quiet(precision=precision, device="cuda"))
    assert history.final_eval is not None and history.final_eval["auc"] > 0.5


# -- early stopping and the best checkpoint ------------------------------------------------------------------
class GetsWorse:
    """A training stream whose labels flip after the first epoch: epoch 1 learns the truth, every later epoch
    unlearns it, so the evaluation on the true labels is best after epoch 1 and worse after each later one."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches, self.epoch = batches, 0

    def __iter__(self) -> Iterator[Batch]:
        flip = self.epoch > 0
        self.epoch += 1
        for b in self.batches:
            yield Batch(b.dense, b.sparse, 1.0 - b.labels) if flip else b

    def __len__(self) -> int:
        return len(self.batches)


def test_a_run_that_gets_worse_stops_and_keeps_the_best_weights(tmp_path: Path) -> None:
    train, valid = make_batches(20), make_batches(6, seed=1)
    constant = Schedule()  # a constant lr: the flipped epochs really unlearn
    es = EarlyStopping(metric="auc", patience=2, restore_best=True)
    after_one = TinyModel()
    fit(after_one, list(train), valid, quiet(epochs=1, lr=0.02, schedule=constant))
    model = TinyModel()
    cfg = quiet(epochs=10, lr=0.02, schedule=constant, early_stopping=es, out_dir=str(tmp_path))
    history = fit(model, GetsWorse(train), valid, cfg)
    assert [r["epoch"] for r in history.evals] == [1, 2, 3]  # stopped after 2 evaluations without a new best
    assert history.stopped_early and history.steps == 60
    assert history.best_eval is not None and history.best_eval["step"] == 20
    assert history.evals[1]["auc"] < history.evals[0]["auc"] and history.evals[2]["auc"] < history.evals[0]["auc"]
    # restore_best put epoch 1's weights back: the same as a run of one epoch, bit for bit
    for k, v in weights(after_one).items():
        assert torch.equal(model.state_dict()[k], v), k
    assert history.best_checkpoint == tmp_path / "checkpoints" / "best"
    best = TinyModel(seed=5)
    saved = load_checkpoint(history.best_checkpoint, best)  # the best is a checkpoint like the others
    assert saved.extra["step"] == 20 and saved.extra["eval"]["auc"] == history.evals[0]["auc"]
    assert all(torch.equal(best.state_dict()[k], v) for k, v in weights(after_one).items())
    # the last checkpoint holds the last weights, not the best
    assert history.checkpoint is not None and history.checkpoint.name == "step-0000000060"
    last = TinyModel(seed=5)
    load_checkpoint(history.checkpoint, last)
    assert not torch.equal(last.state_dict()["emb.weight"], best.state_dict()["emb.weight"])


def test_without_an_out_dir_restore_best_keeps_the_best_in_memory() -> None:
    train, valid = make_batches(20), make_batches(6, seed=1)
    after_one = TinyModel()
    fit(after_one, list(train), valid, quiet(epochs=1, lr=0.02, schedule=Schedule()))
    model = TinyModel()
    es = EarlyStopping(metric="logloss", patience=1, restore_best=True)
    history = fit(model, GetsWorse(train), valid, quiet(epochs=5, lr=0.02, schedule=Schedule(), early_stopping=es))
    assert history.steps == 40 and history.best_eval is not None and history.best_eval["step"] == 20
    assert history.best_checkpoint is None
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights(after_one).items())


def test_patience_none_never_stops_but_still_tracks_the_best(tmp_path: Path) -> None:
    train, valid = make_batches(10), make_batches(4, seed=1)
    es = EarlyStopping(patience=None, min_delta=0.0)
    history = fit(TinyModel(), GetsWorse(train), valid, quiet(epochs=4, schedule=Schedule(), early_stopping=es))
    assert history.steps == 40 and not history.stopped_early
    assert history.best_eval == max(history.evals, key=lambda r: r["auc"])


@pytest.mark.parametrize("first_epochs", [1, 2])
def test_resume_keeps_the_early_stopping_state(tmp_path: Path, first_epochs: int) -> None:
    """Interrupted at an evaluation (1 epoch: before any bad evaluation, 2: after one) and resumed ==
    one run: the same stop, best evaluation, best checkpoint and last weights."""
    train, valid = make_batches(20), make_batches(6, seed=1)
    es = EarlyStopping(metric="auc", patience=2)
    kw: dict[str, Any] = {"epochs": 10, "lr": 0.02, "schedule": Schedule(), "early_stopping": es}
    whole = TinyModel()
    expected = fit(whole, GetsWorse(train), valid, quiet(out_dir=str(tmp_path / "whole"), **kw))
    assert expected.stopped_early and expected.steps == 60  # best after epoch 1, stopped after epoch 3

    run = str(tmp_path / "part")
    first = fit(TinyModel(), GetsWorse(train), valid, quiet(out_dir=run, max_steps=20 * first_epochs, **kw))
    assert not first.stopped_early
    data = GetsWorse(train)
    data.epoch = first_epochs  # the stream goes on where it was (a plain iterable: the trainer skips nothing)
    resumed = TinyModel(seed=5)
    second = fit(resumed, data, valid, quiet(out_dir=run, resume=True, **kw))
    assert second.stopped_early and second.steps == 60
    assert second.best_eval == expected.best_eval
    assert [r["auc"] for r in second.evals] == [r["auc"] for r in expected.evals]
    a, b = TinyModel(seed=5), TinyModel(seed=6)
    load_checkpoint(tmp_path / "whole" / "checkpoints" / "best", a)
    load_checkpoint(Path(run) / "checkpoints" / "best", b)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in weights(a).items())
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in weights(whole).items())
    # resuming the finished run does nothing more
    again = fit(resumed, GetsWorse(train), valid, quiet(out_dir=run, resume=True, **kw))
    assert again.steps == 60 and again.stopped_early


def test_a_fresh_run_removes_an_old_runs_best(tmp_path: Path) -> None:
    fit(TinyModel(), make_batches(4), make_batches(2, seed=1), quiet(out_dir=str(tmp_path)))
    assert (tmp_path / "checkpoints" / "best" / "index.json").is_file()
    history = fit(TinyModel(), make_batches(4), None, quiet(out_dir=str(tmp_path)))
    assert history.best_checkpoint is None and not (tmp_path / "checkpoints" / "best").exists()
    fit(TinyModel(), make_batches(4), None, quiet(epochs=2, out_dir=str(tmp_path), average_epochs=2))
    assert (tmp_path / "checkpoints" / "average" / "index.json").is_file()
    history = fit(TinyModel(), make_batches(4), None, quiet(out_dir=str(tmp_path)))  # and its epoch average
    assert history.model_checkpoint == history.checkpoint and not (tmp_path / "checkpoints" / "average").exists()


def test_the_default_schedule_decays_over_the_first_epoch() -> None:
    model = TinyModel()
    history = fit(model, make_batches(10), None, quiet(epochs=2, lr=0.1, log_every=1))
    lrs = [r["lr"] for r in history.train]
    assert lrs[0] == pytest.approx(0.1) and lrs[5] == pytest.approx(0.05) and lrs[10:] == [0.0] * 10
    with pytest.raises(ValueError, match="decay_epochs"):
        fit(TinyModel(), iter(make_batches(2)), None, quiet())


def _train_steps(path: Path) -> list[int]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["step"] for r in records if r["split"] == "train"]


def test_a_damaged_latest_checkpoint_is_named_and_the_run_resumes_from_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#20 defect 4: 64 flipped bytes in the latest checkpoint loaded as wrong weights and exit 0."""
    batches = make_batches(5)
    kw: dict[str, Any] = {"epochs": 3, "lr": 0.01, "log_every": 1}
    whole = TinyModel()
    fit(whole, list(batches), None, quiet(out_dir=str(tmp_path / "whole"), **kw))
    run = tmp_path / "part"
    fit(TinyModel(), list(batches), None, quiet(max_steps=9, out_dir=str(run), checkpoint_every=3, **kw))
    latest = run / "checkpoints" / "step-0000000009" / "rank-00000.pt"
    raw = bytearray(latest.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    latest.write_bytes(bytes(raw))
    resumed = TinyModel(seed=123)
    with caplog.at_level("WARNING", logger="hugerec.training.checkpoint"):
        history = fit(resumed, list(batches), None, quiet(out_dir=str(run), resume=True, **kw))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert (
        "step-0000000009/rank-00000.pt is damaged" in warned[0] and "resuming from the checkpoint before" in warned[0]
    )
    assert (run / "checkpoints" / "step-0000000009.damaged").is_dir()
    assert history.steps == 15
    a, b = weights(whole), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed at step 6, bitwise the uninterrupted run
    assert _train_steps(run / "metrics.jsonl") == list(range(1, 16))  # steps 7..9 logged once
    for _, p in list_checkpoints(run / "checkpoints"):
        (p / "rank-00000.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"none of the 3 checkpoints in .* is intact"):
        fit(TinyModel(), list(batches), None, quiet(out_dir=str(run), resume=True, **kw))


def test_resume_truncates_the_log_to_the_checkpoint(tmp_path: Path) -> None:
    """#20 defect 10: the killed window's rows stayed in metrics.jsonl (duplicated and orphan steps)."""
    batches = make_batches(4)
    kw: dict[str, Any] = {"epochs": 2, "lr": 0.01, "log_every": 1, "eval_every": 2}
    fit(TinyModel(), list(batches), batches[:1], quiet(max_steps=7, out_dir=str(tmp_path), checkpoint_every=3, **kw))
    shutil.rmtree(tmp_path / "checkpoints" / "step-0000000007")  # as if killed after step 7 was logged, before its save
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "st')  # and mid-line
    fit(TinyModel(), list(batches), batches[:1], quiet(out_dir=str(tmp_path), resume=True, **kw))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert _train_steps(tmp_path / "metrics.jsonl") == list(range(1, 9))
    assert [r["step"] for r in records if r["split"] == "eval"] == [2, 4, 6, 8]
    assert [r["step"] for r in records if r["split"] == "resume"] == [6]


KILL_SCRIPT = '''
import os, sys, time
import torch
from torch import nn
from hugerec.distributed.launch import init_from_env
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement
from hugerec.distributed.shard import shard
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import DynamicConfig, TableConfig
from hugerec.embedding.optimizers import Adam, RowWiseAdagrad
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.trainer import TrainConfig, fit

out, world, resume, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    init_from_env("gloo")
TABLES = (
    TableConfig("a", 40, 4, optimizer=RowWiseAdagrad(lr=0.1)),
    TableConfig("b", 30, 4, optimizer=Adam(lr=0.05)),
    TableConfig("h", 64, 4, dynamic=DynamicConfig()),
)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(TABLES, RowWiseAdagrad(lr=0.1))
        self.top = nn.Sequential(nn.Linear(self.emb.output_dim + 2, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.top(torch.cat([batch.dense, self.emb(batch.sparse).values], 1)).squeeze(1)

    def dense_parameters(self):
        return self.top.parameters()


class Slow:
    """This rank's part of 6 global batches of 8, with a pause per batch (time for a kill between checkpoints)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(11)
        self.batches = []
        for _ in range(6):
            ids = {f: torch.randint(0, 30, (8,), generator=g) * (977 if f == "h" else 1) for f in ("a", "b", "h")}
            dense, labels = torch.randn(8, 2, generator=g), torch.randint(0, 2, (8,), generator=g).float()
            per, lo = 8 // world, rank * (8 // world)
            sparse = SparseFeatures.from_dense({f: v[lo : lo + per] for f, v in ids.items()})
            self.batches.append(Batch(dense[lo : lo + per], sparse, labels[lo : lo + per]))

    def __iter__(self):
        for b in self.batches:
            time.sleep(pause)
            yield b

    def __len__(self) -> int:
        return len(self.batches)


torch.manual_seed(0)
model = Small()
if world > 1:
    placements = {"a": TablePlacement.row_wise([0, 1]), "b": TablePlacement.column_wise([1, 0]), "h": TablePlacement.row_wise([0, 1])}
    model = shard(model, ShardingPlan(TABLES, placements, world_size=world))
cfg = TrainConfig(epochs=2, lr=0.01, log_every=1, checkpoint_every=2, keep_checkpoints=0, out_dir=out, resume=resume,
                  seed=0, progress=False, tensorboard=False, plot=False)
history = fit(model, Slow(), None, cfg)
assert history.steps == 12, history.steps
'''


def _launch(script: Path, out: Path, world: int, resume: bool, pause: float) -> list[Any]:
    import os
    import subprocess
    import sys

    from hugerec.distributed.launch import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    args = [sys.executable, str(script), str(out), str(world), "1" if resume else "0", str(pause)]
    return [
        subprocess.Popen(args, env=env | ({"RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else {}))
        for r in range(world)
    ]


def _wait(procs: list[Any]) -> None:
    for p in procs:
        assert p.wait(timeout=240) == 0


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The run's last checkpoint read into one unsharded process (tables laid out the same way whatever wrote it)."""
    import importlib.util

    from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint

    spec = importlib.util.spec_from_file_location("kill_script_model", run.parent / "model_only.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)  # the rows no key holds keep their initial values: the same in every comparison
    model = module.Small()
    path = latest_checkpoint(run / "checkpoints")
    assert path is not None and path.name == "step-0000000012"
    load_checkpoint(path, model)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_kill_9_between_checkpoints_then_resume_is_exact(tmp_path: Path, world: int) -> None:
    """A run killed with SIGKILL resumes from its newest checkpoint to the uninterrupted run's weights, bitwise:
    in one process and on 2 sharded gloo ranks (row-wise, column-wise and a dynamic table); metrics.jsonl
    ends up with every step once. The killed 2-rank run also resumes in one process (another layout)."""
    import signal
    import time

    script = tmp_path / "kill_script.py"
    script.write_text(KILL_SCRIPT)
    head = KILL_SCRIPT.split("out, world, resume, pause")[0]
    body = KILL_SCRIPT.split("class Small")[1].split("class Slow")[0]
    tables = KILL_SCRIPT.split("TABLES = ")[1].split("\n\n\n")[0]
    (tmp_path / "model_only.py").write_text(f"{head}TABLES = {tables}\n\n\nclass Small{body}")

    _wait(_launch(script, tmp_path / "whole", world, False, 0.0))
    killed = tmp_path / "killed"
    procs = _launch(script, killed, world, False, 0.3)
    deadline = time.monotonic() + 120
    while not list_checkpoints(killed / "checkpoints") or list_checkpoints(killed / "checkpoints")[-1][0] < 4:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    time.sleep(0.45)  # past the checkpoint: steps after it are logged, then lost
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    saved = [s for s, _ in list_checkpoints(killed / "checkpoints")]
    assert 4 <= saved[-1] < 12
    if world == 2:
        shutil.copytree(killed, tmp_path / "resharded")
    _wait(_launch(script, killed, world, True, 0.0))
    want, got = _final_weights(tmp_path / "whole"), _final_weights(killed)
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert _train_steps(killed / "metrics.jsonl") == list(range(1, 13))
    if world == 2:  # 2 ranks -> 1 process: model, optimizer, step and history carry over
        _wait(_launch(script, tmp_path / "resharded", 1, True, 0.0))
        assert _train_steps(tmp_path / "resharded" / "metrics.jsonl") == list(range(1, 13))


def test_resume_refuses_a_checkpoint_fit_did_not_write(tmp_path: Path) -> None:
    from hugerec.training.checkpoint import save_checkpoint

    model = TinyModel()
    save_checkpoint(tmp_path / "checkpoints", 5, model, torch.optim.Adam(model.parameters()), extra={"step": 5})
    with pytest.raises(ValueError, match=r"step-0000000005 is a checkpoint, but not one written by fit"):
        fit(TinyModel(), make_batches(2), None, quiet(out_dir=str(tmp_path), resume=True))


def _evals(path: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["split"] == "eval"]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # seven training processes, each importing torch: minutes on a loaded machine
@pytest.mark.parametrize(("kind", "average"), [("two_tower", 1), ("sasrec", 1), ("sasrec", 2)])
def test_kill_9_mid_epoch_mid_checkpoint_and_mid_evaluation_then_resume_is_exact(family_runs: Any, kind: str, average: int) -> None:
    """A two-tower (sampled softmax with history masking) and a SASRec (dropout, mixed negatives) killed with
    SIGKILL while preparing a batch mid-epoch, while writing a checkpoint (its rank file written, its index
    not) and while evaluating: each resumed run ends with the uninterrupted run's weights bit for bit, the
    same evaluations, and every training step logged once. With average_epochs 2 the evaluations (every 4
    steps: mid-epoch, over the last epoch end's snapshot and the weights as they are) read the ring of epoch
    snapshots, which the resumed run must have back exactly."""
    family_runs.run("whole", kind, average=average)
    want = family_runs.final_weights("whole", kind)
    steps = int((family_runs.root / "whole.done").read_text())
    for point in ("epoch", "checkpoint", "eval"):
        family_runs.kill(point, kind, point, average=average)
        assert not (family_runs.root / f"{point}.done").exists()
        family_runs.run(point, kind, resume=True, average=average)
        got = family_runs.final_weights(point, kind)
        assert want.keys() == got.keys()
        assert [k for k in want if not torch.equal(want[k], got[k])] == [], point
        assert family_runs.train_steps(point) == list(range(1, steps + 1)), point
        assert _evals(family_runs.root / point / "metrics.jsonl") == _evals(family_runs.root / "whole" / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # eleven training processes (1 + 2 + 3 + 2 + 3 ranks)
@pytest.mark.parametrize("kind", ["two_tower", "sasrec"])
def test_sharded_on_2_and_3_gloo_ranks_equals_one_process_and_resumes_on_another_count(family_runs: Any, kind: str) -> None:
    """The planner's plan with the id tables pinned row-wise (two-tower: user and item tables; SASRec: the
    item table): 2 and 3 gloo ranks, each training its rows of every batch, end where one process does
    (in-batch negatives gathered across ranks); a 2-rank run killed mid-epoch resumes on 3 ranks and
    finishes every step (the data order restarts at the checkpoint's step, the model carries over). The dense
    part steps with SGD here: the runs differ in rounding, and Adam would blow the rounding noise of the
    attention key bias's zero gradient up to full steps."""
    family_runs.run("one", kind, dropout=0.0, dense="sgd")
    want = family_runs.final_weights("one", kind)
    for world in (2, 3):
        family_runs.run(f"w{world}", kind, world=world, dropout=0.0, dense="sgd")
        got = family_runs.final_weights(f"w{world}", kind)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k, w=world: f"{w} ranks, {k}: {m}")
    steps = int((family_runs.root / "one.done").read_text())
    family_runs.kill("moved", kind, "epoch", world=2)
    family_runs.run("moved", kind, world=3, resume=True)
    assert family_runs.train_steps("moved") == list(range(1, steps + 1))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["hstu", "hstu_ranked"])
def test_hstu_on_2_gloo_ranks_equals_one_process_with_and_without_its_ranking_loss(family_runs: Any, kind: str) -> None:
    """HSTU sharded on 2 gloo ranks ends where one process does. Without the ranking loss its ranking head
    (and, without times, its time bias) gets no gradient: DDP must be told (shard() does, from the model's
    optional_parameters), or the second step fails. With the ranking loss (weight 0.5) the step runs it
    through the model's forward, whose gradients DDP averages (forward_ranked called directly left each
    rank on its own gradients), each rank drawing its slice of the one global draw of ranking negatives."""
    family_runs.run("one", kind, dropout=0.0, dense="sgd")
    want = family_runs.final_weights("one", kind)
    torch.manual_seed(0)
    init = HSTU(SequenceConfig(num_items=30, max_len=6, dim=8, num_layers=1, dropout=0.0)).state_dict()
    assert torch.equal(want["rank.weight"], init["rank.weight"]) == (kind == "hstu")  # the head trains with its loss only
    family_runs.run("w2", kind, world=2, dropout=0.0, dense="sgd")
    got = family_runs.final_weights("w2", kind)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"2 ranks, {k}: {m}")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["sasrec_bce", "hstu_ranked", "masked"])
def test_per_row_draws_on_3_gloo_ranks_of_uneven_shares_equal_one_process(family_runs: Any, kind: str) -> None:
    """BCE draws a negative per position, the ranking head ranking_negatives per window, the masked model
    its masks per position: on 3 ranks the batches of 16 windows split 5, 5, 6 (the epoch's last, of 10: 3,
    3, 4), and each rank draws the one process's draw for the whole global batch and keeps its own rows
    (window_batches' RankWindows say where they sit), so the runs end where one process does. Before, each
    rank drew a [3, its rows, ...] block and took its slice (misaligned rows, generators that drifted
    apart), and the masked model drew every rank the first rows' masks."""
    family_runs.run("one", kind, dropout=0.0, dense="sgd")
    want = family_runs.final_weights("one", kind)
    family_runs.run("w3", kind, world=3, dropout=0.0, dense="sgd")
    got = family_runs.final_weights("w3", kind)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"3 ranks, {k}: {m}")


def test_window_batches_tell_each_rank_where_its_rows_sit() -> None:
    """Under torchrun each batch is a RankWindows: this rank's rows of the global batch (15 windows on 2
    ranks: 7 and 8), its first row and the global batch's rows; the ranks' rows in order are one process's
    batch. In one process the batches are the windows themselves, as before."""
    import numpy as np

    from hugerec.training.sequential import RankWindows, TimedWindows, window_batches

    windows = np.arange(1, 15 * 3 + 1).reshape(15, 3)
    one = list(window_batches(windows, 15, seed=3))
    assert len(one) == 1 and isinstance(one[0], torch.Tensor)
    parts = [list(window_batches(windows, 15, seed=3, rank=r, world=2)) for r in range(2)]
    places = [(len(b.batch), b.first, b.total) for p in parts for b in p if isinstance(b, RankWindows)]  # type: ignore[arg-type]
    assert places == [(7, 0, 15), (8, 7, 15)]
    assert torch.equal(torch.cat([p[0].batch for p in parts]), one[0])  # type: ignore[union-attr]
    timed = list(window_batches(windows, 15, seed=3, rank=1, world=2, times=windows * 10))
    assert isinstance(timed[0], RankWindows) and isinstance(timed[0].batch, TimedWindows)
    assert torch.equal(timed[0].batch.times, timed[0].batch.windows * 10) and timed[0].first == 7


def test_resume_refuses_a_changed_config_and_another_family(tmp_path: Path) -> None:
    """Keys that shape the weights may not change on resume (named, old -> new); how far the run goes may.
    A checkpoint of another family is refused with one line naming it, before anything is loaded."""
    import numpy as np

    from hugerec.training.retrieval import RetrievalFamily

    run = str(tmp_path)
    fit(TinyModel(), make_batches(4), None, quiet(max_steps=2, out_dir=run, checkpoint_every=1, lr=0.01))
    with pytest.raises(ValueError, match=r"config changed \(lr: 0\.01 -> 0\.02, weight_decay: 0\.0 -> 0\.1\)") as e:
        fit(TinyModel(), make_batches(4), None, quiet(out_dir=run, resume=True, lr=0.02, weight_decay=0.1))
    assert "step-0000000002" in str(e.value) and "\n" not in str(e.value)
    history = fit(TinyModel(), make_batches(4), None, quiet(out_dir=run, resume=True, lr=0.01, epochs=2, log_every=1))
    assert history.steps == 8  # more epochs, another log window: allowed
    with pytest.raises(ValueError, match=r"step-0000000008 is a checkpoint of a ranking model; this run trains a retrieval model"):
        fit(TinyModel(), make_batches(4), None, quiet(out_dir=run, resume=True), family=RetrievalFamily(np.ones(4)))


def test_evaluate_names_the_data_a_tree_model_takes() -> None:
    """evaluate dispatches on the data: batches are a ranking model's, a FeatureMatrix the trees'."""
    from hugerec.models.gbm import FeatureMatrix

    matrix = FeatureMatrix(np.zeros((2, 1), np.float32), np.zeros(2, np.float32), ("x",), 1)
    with pytest.raises(TypeError, match="a FeatureMatrix is the data of trees, not of a Linear"):
        evaluate(torch.nn.Linear(1, 1), matrix)


def test_progress_in_a_log_file_is_a_line_per_window_and_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    """Paper cut 8: with stderr not a terminal (a file, a CI log) the progress is plain lines, no bar's
    carriage returns; the evaluation lines say which one is the best."""
    train, valid = make_batches(8), make_batches(4, seed=1)
    cfg = TrainConfig(epochs=2, lr=0.02, log_every=4, progress=True, tensorboard=False, plot=False)
    fit(TinyModel(), train, valid, cfg)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 4/16", "step 8/16", "step 8/16", "step 12/16", "step 16/16", "step 16/16"]
    assert lines[0].startswith("step 4/16: loss=") and "samples/s" in lines[0]
    assert lines[2].startswith("step 8/16: eval auc=") and lines[2].endswith(" (best)")


class EpochSnapshots:
    """The batches, and a copy of the model's weights as each epoch after the first starts (its previous
    epoch's end): the raw trajectory that epoch averaging takes its means of."""

    def __init__(self, batches: list[Batch], model: nn.Module) -> None:
        self.batches, self.model = batches, model
        self.taken: list[dict[str, torch.Tensor]] = []
        self.started = 0

    def __iter__(self) -> Iterator[Batch]:
        if self.started:
            self.taken.append(weights(self.model))
        self.started += 1
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


AVERAGED = ("emb.tables.ids.weight", "mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias")


def test_average_epochs_evaluates_keeps_and_returns_the_mean_of_the_last_k_epoch_ends(tmp_path: Path) -> None:
    """A raw run (average_epochs 1) gives the epoch-end weights; the run with average_epochs 3 trains the same
    trajectory (its last checkpoint holds the raw weights, bit for bit), evaluates at each epoch the NumPy mean
    of the last 3 epoch ends (fewer at first), keeps the best of those means as best/ and returns the mean of
    the last 3. The optimizer state is the raw run's."""
    batches, valid = make_batches(4), make_batches(2, seed=1)
    kw: dict[str, Any] = {"epochs": 5, "lr": 0.02, "schedule": Schedule(), "pipeline": False}
    kw["early_stopping"] = EarlyStopping(patience=None)
    raw_model = SparseTinyModel(Adam(lr=0.05))
    data = EpochSnapshots(batches, raw_model)
    raw = fit(raw_model, data, valid, quiet(**kw))
    ends = [*data.taken, weights(raw_model)]  # the weights at the end of epochs 1..5
    assert len(ends) == 5

    model = SparseTinyModel(Adam(lr=0.05))
    history = fit(model, list(batches), valid, quiet(out_dir=str(tmp_path), average_epochs=3, **kw))
    got = weights(model)
    for key in AVERAGED:
        want = np.mean(np.stack([e[key].double().numpy() for e in ends[-3:]]), axis=0)
        np.testing.assert_allclose(got[key].double().numpy(), want, rtol=1e-6, atol=1e-7, err_msg=key)
    assert torch.equal(got["emb.tables.ids.exp_avg"], ends[-1]["emb.tables.ids.exp_avg"])  # not averaged
    last = SparseTinyModel(Adam(lr=0.05), seed=5)
    load_checkpoint(list_checkpoints(tmp_path / "checkpoints")[-1][1], last)
    assert all(torch.equal(weights(last)[k], ends[-1][k]) for k in ends[-1])  # training went on from the raw weights
    assert history.model_checkpoint == tmp_path / "checkpoints" / "average"  # the returned mean, for a CLI reader
    returned = SparseTinyModel(Adam(lr=0.05), seed=6)
    load_checkpoint(history.model_checkpoint, returned)
    assert all(torch.equal(weights(returned)[k], got[k]) for k in AVERAGED)
    for epoch, record in enumerate(history.evals, start=1):  # each evaluation scored the mean of the last <= 3 ends
        probe = SparseTinyModel(Adam(lr=0.05), seed=7)
        mean = dict(ends[epoch - 1])
        for key in AVERAGED:
            mean[key] = torch.stack([e[key] for e in ends[max(epoch - 3, 0) : epoch]]).double().mean(0).float()
        probe.load_state_dict(mean)
        assert evaluate(probe, valid)["auc"] == pytest.approx(record["auc"], abs=1e-9), epoch
    assert [r["auc"] for r in history.evals] != [r["auc"] for r in raw.evals]
    assert history.best_eval is not None and history.best_checkpoint is not None
    best = SparseTinyModel(Adam(lr=0.05), seed=9)
    load_checkpoint(history.best_checkpoint, best)
    assert evaluate(best, valid)["auc"] == pytest.approx(history.best_eval["auc"], abs=1e-9)


def test_average_epochs_1_is_the_run_without_it_bit_for_bit() -> None:
    batches, valid = make_batches(5), make_batches(2, seed=1)
    runs = []
    for extra in ({}, {"average_epochs": 1}):
        model = SparseTinyModel(Adam(lr=0.05))
        history = fit(model, list(batches), valid, quiet(epochs=3, lr=0.01, early_stopping=EarlyStopping(patience=None), **extra))
        runs.append((weights(model), [r["auc"] for r in history.evals]))
        assert history.model_checkpoint is None  # no out_dir
    assert runs[0][1] == runs[1][1]
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])


@pytest.mark.parametrize("first_steps", [7, 10, 13])  # mid-epoch, at an epoch's last batch, after a mid-run eval
def test_resume_is_exact_with_epoch_averaging(tmp_path: Path, first_steps: int) -> None:
    """N steps + resume + M steps == N + M steps with average_epochs 3: the same evaluations (every 4 steps and
    at epoch ends: means over the ring, which the checkpoint carries), the same returned mean, the same best/."""
    batches, valid = make_batches(5), make_batches(2, seed=1)
    kw: dict[str, Any] = {"epochs": 4, "lr": 0.01, "eval_every": 4, "average_epochs": 3, "schedule": Schedule()}
    kw["early_stopping"] = EarlyStopping(patience=None)
    whole = SparseTinyModel(Adam(lr=0.05))
    expected = fit(whole, ShufflingLoader(batches), valid, quiet(out_dir=str(tmp_path / "whole"), **kw))
    run = str(tmp_path / "part")
    first = fit(SparseTinyModel(Adam(lr=0.05)), ShufflingLoader(batches), valid, quiet(max_steps=first_steps, out_dir=run, checkpoint_every=3, **kw))
    assert first.steps == first_steps
    resumed = SparseTinyModel(Adam(lr=0.05), seed=123)
    second = fit(resumed, ShufflingLoader(batches), valid, quiet(out_dir=run, resume=True, **kw))
    assert second.steps == 20
    got = {r["step"]: r["auc"] for r in second.evals}
    assert all(got[r["step"]] == r["auc"] for r in expected.evals)
    a, b = weights(whole), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    best_a, best_b = SparseTinyModel(Adam(lr=0.05)), SparseTinyModel(Adam(lr=0.05))
    assert expected.best_checkpoint is not None and second.best_checkpoint is not None
    load_checkpoint(expected.best_checkpoint, best_a)
    load_checkpoint(second.best_checkpoint, best_b)
    assert all(torch.equal(weights(best_a)[k], weights(best_b)[k]) for k in AVERAGED)


def test_average_epochs_is_refused_when_bad_changed_on_resume_or_resumed_on_other_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hugerec.cli.config_file import ConfigError, from_dict
    from hugerec.training import checkpoint as checkpoint_module
    from hugerec.training import trainer as trainer_module

    for bad in (0, -2, True, 2.5, "3"):
        with pytest.raises(ValueError, match=r"^TrainConfig: average_epochs must be an int >= 1 \(1: no averaging\)"):
            TrainConfig(average_epochs=bad)  # type: ignore[arg-type]
    assert from_dict(TrainConfig, {"average_epochs": 4}, "train").average_epochs == 4  # the [train] key
    with pytest.raises(ConfigError, match=r"^train: TrainConfig: average_epochs must be an int >= 1"):
        from_dict(TrainConfig, {"average_epochs": 0}, "train")
    run = str(tmp_path)
    fit(SparseTinyModel(Adam(lr=0.05)), make_batches(4), None, quiet(max_steps=6, out_dir=run, checkpoint_every=3))
    with pytest.raises(ValueError, match=r"config changed \(average_epochs: 1 -> 2\)"):
        fit(SparseTinyModel(Adam(lr=0.05)), make_batches(4), None, quiet(out_dir=run, resume=True, average_epochs=2))
    averaged = str(tmp_path / "averaged")
    fit(SparseTinyModel(Adam(lr=0.05)), make_batches(4), None, quiet(max_steps=6, out_dir=averaged, checkpoint_every=3, average_epochs=2))
    real = checkpoint_module.load_checkpoint

    def from_another_group(path: Any, model: Any, optimizer: Any = None, *, verified: bool = False) -> Any:
        resumed = real(path, model, optimizer, verified=verified)
        return checkpoint_module.Resumed(resumed.path, resumed.extra, None)  # as a group of another size reads it

    monkeypatch.setattr(trainer_module, "load_checkpoint", from_another_group)
    with pytest.raises(ValueError, match=r"with average_epochs = 2 on another number of ranks"):
        fit(SparseTinyModel(Adam(lr=0.05)), make_batches(4), None, quiet(epochs=3, out_dir=averaged, resume=True, average_epochs=2))
