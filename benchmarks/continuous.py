"""Continuous training: the loop against a frozen model and a daily retrain, drift detection, iteration and
monitor time.

    python benchmarks/continuous.py [--quick] [--json PATH] [--rows-per-day N] [--monitor-rows N]
        [--epochs N] [--intraday MINUTES ...] [--intraday-only] [--week-load-rows N] [--week-load-only]
        [--config-week-only] [--config-week-rows N] [--two-tower-only] [--two-tower-repeats N]

Stream: hugerec.data.synthetic_stream, 7 days (0..6), 6 sparse features (vocabulary 2,000, 2% of the
ids of every popularity rank replaced by new ids each day) + 4 dense, concept drift on day 4 (half
the per-id effects redrawn, dense coefficients flipped), feature shift on day 6 (dense d0, d1 moved by
1.5 std, c0's Zipf exponent 1.1 -> 0.6). Every model is the same DLRM (dim 8, dynamic tables).
The issue's size, 1,000,000 rows a day, is the default (`--quick`: 30,000).

Protocol, per day d = 1..6 (config `day <d> lift`), as the issue words it ("every day's next-day
holdout"; the loop "evaluates the candidate on the next window's holdout"): each method's model as it
stands after training on days < d is scored on day d's 10% holdout, the next-day holdout of a model
trained on day d-1 (no method trains on it). Value: (AUC - 0.5) / (oracle AUC - 0.5) on those rows,
the oracle being the stream's true probabilities: 1.0 is the best possible. The loop's gate also
read that holdout (to refuse a worse candidate), so each record also gives `lift_on_unseen_rest`:
the same lift on the other 90% of day d, which no model and no gate has seen before day d's step.
Day 4 (the concept drift) cannot be met by any model trained on days < 4: the hidden model changed
at midnight and day 4's rows are the first sight of it; the loop sees the drop there and day 5's
figure shows how it recovers.
    hugerec-loop   hugerec.continuous.Loop (offline): warm start from the last published checkpoint,
                   1 epoch on day d-1, gated on day d's holdout; the model serving after that step.
                   When the gate saw the serving model fall below its baseline AUC (the concept drift),
                   the next day runs the loop's recovery (loop.Recovery: the pre-drift model, its sparse
                   optimizer state reset, 2 epochs at lr 1e-2 on the drift day)
    frozen         the day-0 model, never retrained
    retrain-daily  a fresh model trained on day d-1 only (same epochs)
    hugerec-loop-<m>min (`--intraday m`, day 4 only) the same loop on windows of m minutes over days 3
                   and 4 (from scratch at day 3, 00:00): each of day 4's holdout rows scored by the model
                   serving during its window; day 4's first window is the first sight of the new concept
    retrain-since-drift-<m>min (with it, m >= 15) a loop that retrains a fresh model at every window on
                   every earlier row of day 4 (2 epochs, lr 1e-2)
`drift detection` (hugerec-loop): when day d arrives, the monitor on day d's rows against day d-1's
(the reference the serving model was trained on) plus the KPIs on day d's labels of the model serving
at that moment (published at step d-2) against its gate AUC (decisions.retrain_reason, defaults). Value: share of the injected days (4, 6) that
alarm; `drift false alarms`: alarms on the other days (1, 2, 3, 5).
`loop_synthetic day <d> lift` / `loop_synthetic lift kept`: `hugerec loop configs/loop_synthetic.toml` (its
stream: 20,000 rows a day, `--quick` 10,000; its training settings; offline) for a week, once as the config stands
(`dlrm-loop`, the reference) and once with `model.type=dcn_v2 model.deep=[32]` (`hugerec-loop-dcn_v2`); each
day d = 1..6 scored on day d's holdout by the model serving after step d-1, the same lift as above; `lift kept`:
the smallest over days 1-3, 5, 6.
`two_tower day <d> recall@50` / `two_tower day <d> iteration time`: the two-tower loop on a drifting interaction
stream against a two-tower retrained from scratch on every day so far (two_tower_week's docstring); the times are
medians over `--two-tower-repeats` loops run side by side (3; `--quick`: 1).
`two_tower gate top-50`: the gate's exact top-50 of the serving model over the last day's users and every item,
`hugerec-top_k` (the Numba block selection) against `torch-topk-int64-keys` (the torch path it replaced).
`iteration time`: one loop step on day 5 (warm start, train a day, gate) plus publishing its model to a server in
this process (export the bundle, load it, make it the canary; the model of day 4 already stable)
against a full retrain from scratch on days 0..5 (same epochs, same rows per day).
`monitor time`: one window's monitor report over N logged rows x 40 features (20 numeric, 20
categorical, with predictions and labels) against a reference of N rows; baseline `scipy-ks`: the
two-sample KS test (scipy.stats.ks_2samp) on each of the 40 columns.
`week load` (hugerec-loop; small sizes, `--week-load-rows` a day): the loop publishing to a server in
this process over 7 windows (canary share 0.5) while a thread sends one 4-row /predict at a time all
week; days 1 and 4 are trained from scratch on inverted labels (canaries to roll back), 1,600 of each
day's users are replayed with their labels as feedback. Value: failed requests; also the answers per version and the
answers from a version that was not live, by the decision log (decision_log.live_intervals), while the
request was in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from scipy.stats import ks_2samp

from hugerec.continuous.decision_log import Record, live_intervals
from hugerec.continuous.decisions import DecisionConfig, Kpis, Observation, retrain_reason
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec, Recovery
from hugerec.continuous.monitor import MonitorConfig, Reference, auc, report
from hugerec.continuous.observer import ServerObserver
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.traffic import BackgroundLoad, Replay, instances, replay
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.data.windows import Windows, WindowUnit, holdout_mask, table_batches
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.model_config import DLRMConfig
from hugerec.serving.bundles.export import export
from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.training.trainer import TrainConfig, fit, predict

TOKEN = "continuous-benchmark-token"
SPEC = ModelSpec(DLRMConfig(bottom=(32, 8), top=(32, 1)), dim=8, optimizer=Adagrad(lr=0.05), capacity=50_000)


def _record(config: str, method: str, value: float, unit: str, higher_is_better: bool, **extra: Any) -> dict[str, Any]:
    return {
        "config": config,
        "method": method,
        "value": value,
        "unit": unit,
        "higher_is_better": higher_is_better,
        **extra,
    }


def _scores(model: torch.nn.Module, table: pa.Table, cfg: StreamConfig) -> np.ndarray:
    return torch.cat(list(predict(model, table_batches(table, cfg.schema, 8192), device="cpu"))).numpy()


def _lift(p: np.ndarray, y: np.ndarray, oracle: np.ndarray) -> float:
    return (auc(p, y) - 0.5) / (auc(oracle, y) - 0.5)


def run(rows_per_day: int, monitor_rows: int, epochs: int) -> list[dict[str, Any]]:
    cfg = StreamConfig(days=7, rows_per_day=rows_per_day, concept_drift_day=4, feature_shift_day=6)
    stream = Stream(cfg)
    days = [stream.day(d) for d in range(7)]
    tables = [d.table for d in days]
    work = tempfile.mkdtemp(prefix="hugerec-continuous-")
    lc = LoopConfig(work, cfg.schema, model=SPEC, batch_size=512, lr=3e-3, epochs=epochs, keep_all_checkpoints=True)
    loop = Loop(lc, tables.__getitem__)
    train_cfg = TrainConfig(
        epochs=epochs, lr=3e-3, progress=False, tensorboard=False, plot=False, device="cpu", pipeline=False, seed=0
    )
    records: list[dict[str, Any]] = []
    unseen = [~holdout_mask(t.num_rows, lc.holdout_share, lc.seed) for t in tables]  # day d's training part
    serving_after: dict[int, str | None] = {}
    step_seconds: dict[int, float] = {}
    for d in range(6):
        t0 = time.perf_counter()
        loop.step(d)
        step_seconds[d] = time.perf_counter() - t0
        serving_after[d] = loop.serving_version()
    frozen = loop.load("w0")
    alarms = []
    decisions = DecisionConfig()
    mcfg = MonitorConfig()
    for d in range(1, 7):
        held = ~unseen[d]  # day d's holdout: the next-day holdout of every model trained on days < d
        holdout, rest = tables[d].filter(pa.array(held)), tables[d].filter(pa.array(unseen[d]))
        y, y_rest = holdout["label"].to_numpy(), rest["label"].to_numpy()
        oracle, oracle_rest = days[d].probability[held], days[d].probability[unseen[d]]
        version = serving_after[d - 1]
        assert version is not None
        fresh = SPEC.build(cfg.schema, 0)
        fit(
            fresh,
            table_batches(tables[d - 1].filter(pa.array(unseen[d - 1])), cfg.schema, 512, True, d),
            config=train_cfg,
        )
        for method, model in (
            ("hugerec-loop", loop.load(version)),
            ("frozen", frozen),
            ("retrain-daily", fresh.eval()),
        ):
            p, p_rest = _scores(model, holdout, cfg), _scores(model, rest, cfg)
            lift_on_rest = _lift(p_rest, y_rest, oracle_rest)
            records.append(
                _record(
                    f"day {d} lift",
                    method,
                    _lift(p, y, oracle),
                    "share of oracle lift",
                    True,
                    auc=auc(p, y),
                    oracle_auc=auc(oracle, y),
                    rows=int(y.size),
                    lift_on_unseen_rest=lift_on_rest,
                )
            )
            print(
                f"day {d} lift {method}: {records[-1]['value']:.4f} (rest of day {d}: {lift_on_rest:.4f})", flush=True
            )
        # drift when day d arrives: the monitor on day d against day d-1, and the KPIs on day d's labels of the
        # model serving then (published at step d-2, gated on day d-1: its gate AUC is the baseline)
        ref = Reference.of(tables[d - 1], cfg.dense_names, cfg.sparse_names, mcfg)
        rep = report(d, ref, tables[d])
        live = serving_after.get(d - 2)
        kpis_then: dict[str, Kpis] = {}
        if live is not None:
            p_live = _scores(loop.load(live), rest, cfg)
            kpis_then["stable"] = Kpis(
                int(y_rest.size), auc(p_live, y_rest), float(y_rest.mean()), float(p_live.mean())
            )
        obs = Observation(kpis_then, rep.observation().drift)
        found = None if live is None else loop.baseline(live)
        why = retrain_reason(obs, None if found is None else found[0], decisions, 0.0 if found is None else found[1])
        alarms.append((d, None if why is None else why.reason))
        print(f"day {d}: serving {live} when the day arrives, alarm: {alarms[-1][1]}", flush=True)
    injected = {4, 6}
    detected = sum(1 for d, why in alarms if why is not None and d in injected) / len(injected)
    false = sum(1 for d, why in alarms if why is not None and d not in injected)
    records.append(
        _record(
            "drift detection",
            "hugerec-loop",
            detected,
            "share of injected days",
            True,
            alarms={str(d): why for d, why in alarms},
        )
    )
    records.append(_record("drift false alarms", "hugerec-loop", float(false), "drift-free days alarmed", False))
    # one loop iteration: step 5 above, plus publishing its model to a server in this process (export the
    # bundle, load it, make it the canary), where the model of step 4 is already stable; vs a full retrain
    publish_seconds = _publish_seconds(loop, serving_after[4] or "w0", serving_after[5] or "w0", Path(work), cfg)
    iteration = step_seconds[5] + publish_seconds
    history = pa.concat_tables([tables[j].filter(pa.array(unseen[j])) for j in range(6)])
    t0 = time.perf_counter()
    full = SPEC.build(cfg.schema, 0)
    fit(full, table_batches(history, cfg.schema, 512, True, 0), config=train_cfg)
    retrain = time.perf_counter() - t0
    records.append(
        _record(
            "iteration time",
            "hugerec-loop",
            iteration,
            "s",
            False,
            ratio_to_full_retrain=iteration / retrain,
            step_seconds=step_seconds[5],
            publish_seconds=publish_seconds,
        )
    )
    records.append(_record("iteration time", "full-retrain", retrain, "s", False))
    records += monitor_time(monitor_rows)
    return records


CONFIG = Path(__file__).resolve().parents[1] / "configs" / "loop_synthetic.toml"
# the loop's models on configs/loop_synthetic.toml: the DLRM the config names (the reference) and DCN-v2 with a deep
# MLP as wide as the DLRM's top MLP (model.type=dcn_v2 starts [model] from DCN-v2's defaults: 3 cross layers)
CONFIG_MODELS = {"dlrm-loop": [], "hugerec-loop-dcn_v2": ["model.type=dcn_v2", "model.deep=[32]"]}
KEPT_DAYS = (1, 2, 3, 5, 6)  # every day but the concept drift's (no model trained before day 4 can know it)


def config_week(rows_per_day: int | None) -> list[dict[str, Any]]:
    """`hugerec loop configs/loop_synthetic.toml` (offline: a published candidate serves at once) for a week with
    each model of CONFIG_MODELS: windows 0..5 trained, day d = 1..6 (config `loop_synthetic day <d> lift`) scored
    on day d's holdout by the model serving after step d - 1, as (AUC - 0.5) / (oracle AUC - 0.5); nothing serving
    yet scores 0. `loop_synthetic lift kept` is the smallest lift over KEPT_DAYS (the issue asks >= 0.95)."""
    from hugerec.cli.loop_command import LoopFile, load_loop_file, loop_config

    records: list[dict[str, Any]] = []
    kept: dict[str, float] = {}
    for method, overrides in CONFIG_MODELS.items():
        sizes = [] if rows_per_day is None else [f"data.stream.rows_per_day={rows_per_day}"]
        work = tempfile.mkdtemp(prefix="hugerec-config-week-")
        cfg, _ = load_loop_file(str(CONFIG), ["server.mode=offline", f"loop.work_dir={work}", *sizes, *overrides])
        assert isinstance(cfg, LoopFile) and cfg.data.stream is not None
        stream_config = cfg.data.stream  # a ranking loop over the synthetic stream
        stream = Stream(stream_config)
        days = [stream.day(d) for d in range(stream_config.days)]
        lc = loop_config(cfg)
        loop = Loop(lc, [day.table for day in days].__getitem__)
        t0 = time.perf_counter()
        lifts = {}
        for d in range(1, len(days)):
            loop.step(d - 1)
            version = loop.serving_version()
            held = holdout_mask(days[d].table.num_rows, lc.holdout_share, lc.seed)
            holdout = days[d].table.filter(pa.array(held))
            y, oracle = holdout["label"].to_numpy(), days[d].probability[held]
            p = np.full(y.shape, 0.5) if version is None else _scores(loop.load(version), holdout, stream_config)
            lifts[d] = _lift(p, y, oracle)
            records.append(
                _record(
                    f"loop_synthetic day {d} lift",
                    method,
                    lifts[d],
                    "share of oracle lift",
                    True,
                    serving=version,
                    auc=auc(p, y),
                    oracle_auc=auc(oracle, y),
                    rows=int(y.size),
                )
            )
            print(f"loop_synthetic day {d} lift {method} ({version}): {lifts[d]:.4f}", flush=True)
        kept[method] = min(lifts[d] for d in KEPT_DAYS)
        records.append(
            _record(
                "loop_synthetic lift kept",
                method,
                kept[method],
                "min share of oracle lift, days 1-3, 5, 6",
                True,
                model=overrides,
                rows_per_day=stream_config.rows_per_day,
                seconds=time.perf_counter() - t0,
            )
        )
    records[-1]["ratio_to_dlrm_loop"] = kept["hugerec-loop-dcn_v2"] / kept["dlrm-loop"]
    return records


def two_tower_week(users: int, items: int, overrides: tuple[str, ...] = (), repeats: int = 1) -> list[dict[str, Any]]:
    """The two-tower loop of configs/loop_two_tower.toml (continuous.retrieval_loop, offline: a published pipeline
    serves at once; the config's model, epochs, batch, learning rates, index; `overrides` as on the command line)
    on its drifting interaction stream (data.synthetic_interactions.generate_interaction_days: `users` x `items`,
    5-15 events per user a day, drift 0.2, 20% of the items launched on days 1..), against a two-tower retrained
    from scratch on every day so far (the same config). Day d = 1..days-1 (config `two_tower day <d> recall@50`):
    each user's day-d items among the items they had not met before; ours answered by the served pipeline after
    step d-1 (its ANN index, exclude-seen, the popular fill), the reference by exact top-50 over every item.
    `two_tower day <d> iteration time` (wall) and `... iteration cpu time` (this process's CPU seconds: the cost
    on a machine shared with other work, where wall time measures the neighbours too): the loop's step on day
    d-1 (warm start and train on that day, gate, export the pipeline bundle with a new index) against the
    retrain from scratch on days 0..d-1. Day 1's step is the loop's bootstrap, not an iteration: with nothing
    published to warm-start from, its first model trains from scratch on day 0 with `loop.epochs`, as the retrain
    does, plus its gate and export, so it costs more than the retrain by construction (its records say
    `bootstrap`); from day 2 on each step warm-starts (`loop.warm_start_epochs`, `loop.warm_start_reset_optimizer`,
    `loop.warm_start_replay`: the earlier days' events it replays, counted in the record's `replayed`).
    `repeats` loops run side by side (the same seeded work: each day, each
    loop's step and then its retrain, loop after loop), and each time is the median of its `repeats` samples
    (all in `samples`, the per-loop ratios in `ratios`): one sample moves by a third under a shared machine's
    load. The served Recall@50 is the first loop's. Both sides run after a warm-up loop on a small stream, so
    that neither pays the kernels' compilation."""
    from hugerec.cli.loop_command import load_loop_file
    from hugerec.cli.retrieval_loop_command import RetrievalLoopFile, loop_config
    from hugerec.continuous.retrieval_loop import RetrievalLoop
    from hugerec.data.interactions import held_out_csr
    from hugerec.data.synthetic_interactions import generate_interaction_days
    from hugerec.serving import load
    from hugerec.serving.pipeline.runner import Query
    from hugerec.serving.pipeline.served_pipeline import ServedPipeline
    from hugerec.training.ranking_metrics import list_metrics, subset_csr

    def loop_of(n_users: int, n_items: int, days: int, extra: tuple[str, ...]) -> tuple[RetrievalLoop, Any]:
        sizes = (f"data.interactions.num_users={n_users}", f"data.interactions.num_items={n_items}", f"data.drift.days={days}")
        work = tempfile.mkdtemp(prefix="hugerec-two-tower-loop-")
        file, _ = load_loop_file(str(CONFIG.parent / "loop_two_tower.toml"), ["server.mode=offline", f"loop.work_dir={work}", *sizes, *extra])
        assert isinstance(file, RetrievalLoopFile)
        stream = generate_interaction_days(file.data.interactions, file.data.drift)
        return RetrievalLoop(loop_config(file), stream.day), stream

    warm, _ = loop_of(300, 200, 2, ("gate.min_rows=1",))
    warm.step(0)  # compiles the kernels both sides use
    loops = [loop_of(users, items, 7, overrides) for _ in range(repeats)]
    loop, stream = loops[0]
    cfg = loop.config
    days = stream.drift.days
    records: list[dict[str, Any]] = []
    for d in range(1, days):
        times: dict[str, list[float]] = {"step": [], "step_cpu": [], "retrain": [], "retrain_cpu": []}
        phases: list[dict[str, float]] = []
        for each, _ in loops:
            t0, c0 = time.perf_counter(), time.process_time()
            each.step(d - 1)
            times["step"].append(time.perf_counter() - t0)
            times["step_cpu"].append(time.process_time() - c0)
            phases.append(each.cpu_seconds)
            history = each.history(d - 1)
            t0, c0 = time.perf_counter(), time.process_time()
            scratch = each.build()
            each.train(scratch, history, np.bincount(history.items(), minlength=items), d - 1)
            times["retrain"].append(time.perf_counter() - t0)
            times["retrain_cpu"].append(time.process_time() - c0)
            if each is loop:
                reference_model = scratch
        step, step_cpu, retrain, retrain_cpu = (float(np.median(times[x])) for x in ("step", "step_cpu", "retrain", "retrain_cpu"))
        cpu_ratios = [a / b for a, b in zip(times["step_cpu"], times["retrain_cpu"], strict=True)]
        version = loop.serving_version()
        assert version is not None, loop.log.records[-1]
        # judged on the users the gate did not read (gate.user_share < 1), so that the gate's choice is not
        # also the measurement; with a gate over every user, on every user
        gate = cfg.gate_user_share == 1
        day = held_out_csr(stream.day(d))
        judged = np.flatnonzero((np.diff(day[0]) > 0) & (loop.gate_users == gate))
        held = subset_csr(day, judged)
        pipe = load(loop.bundle(version), name=cfg.name, version=version)
        assert isinstance(pipe, ServedPipeline)  # the retrieval loop publishes pipeline bundles
        try:
            top = torch.full((judged.size, cfg.k), -1, dtype=torch.int64)
            for i, u in enumerate(judged):
                answer = pipe.pipeline.recommend(Query(int(u), cfg.k)).items
                top[i, : len(answer)] = torch.from_numpy(answer)
        finally:
            pipe.close()
        served = list_metrics(top, held, items, (cfg.k,))[f"recall@{cfg.k}"]
        reference, n = loop.recall(reference_model, d, gate=gate)
        trained = [r for r in loop.log.of_window(d - 1) if r.action == "trained"][-1]
        config = f"two_tower day {d} recall@{cfg.k}"
        records.append(_record(config, "hugerec-loop-two_tower", served, "recall", True, serving=version, users=n,
                               ratio_to_from_scratch=served / reference, exact_recall=loop.recall(loop.load(version), d, gate=gate)[0]))
        records.append(_record(config, "two_tower-from-scratch", reference, "recall", True, events=loop.history(d - 1).num_events))
        records.append(_record(f"two_tower day {d} iteration time", "hugerec-loop-two_tower", step, "s", False,
                               ratio_to_from_scratch=step / retrain, samples=times["step"], bootstrap=trained.extra["base"] is None))
        records.append(_record(f"two_tower day {d} iteration time", "two_tower-from-scratch", retrain, "s", False, samples=times["retrain"]))
        records.append(_record(f"two_tower day {d} iteration cpu time", "hugerec-loop-two_tower", step_cpu, "s", False,
                               ratio_to_from_scratch=step_cpu / retrain_cpu, samples=times["step_cpu"], ratios=cpu_ratios, phases=phases,
                               bootstrap=trained.extra["base"] is None, epochs=trained.extra["epochs"], steps=trained.extra["steps"],
                               replayed=trained.extra.get("replayed", 0)))
        records.append(_record(f"two_tower day {d} iteration cpu time", "two_tower-from-scratch", retrain_cpu, "s", False, samples=times["retrain_cpu"]))
        cpu_phases = " + ".join(f"{np.median([p[x] for p in phases]):.2f}" for x in ("train", "gate", "publish"))
        spread = f", per loop {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}x" if repeats > 1 else ""
        what = (f"warm start, {trained.extra['epochs']} epochs, {trained.extra['steps']} steps, {trained.extra.get('replayed', 0)} events replayed"
                if trained.extra["base"] is not None
                else f"bootstrap, not an iteration: the loop's first model, from scratch on day 0 as the retrain, {trained.extra['epochs']} epochs")
        print(f"two_tower day {d}: served {version} recall@{cfg.k} {served:.4f} vs from scratch {reference:.4f} "
              f"({served / reference:.3f}x); iteration ({what}) {step:.2f} s vs retrain {retrain:.2f} s ({step / retrain:.2f}x); "
              f"cpu {step_cpu:.2f} s (train + gate + publish {cpu_phases}) vs {retrain_cpu:.2f} s ({step_cpu / retrain_cpu:.2f}x{spread}); "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    records += _gate_top_k(loop, days - 1)
    return records


def _gate_top_k(loop: Any, k: int, repeats: int = 5) -> list[dict[str, Any]]:
    """`two_tower gate top-<K>`: the gate's exact top-K of one model (the serving one) on window k's users, every
    item scored, their earlier items excluded: `hugerec.index.topk.top_k` (each block's best keys through the
    Numba kernel) against the torch path it replaced (`torch.topk` over the block's int64 keys, `encode`), on
    the same score blocks; CPU seconds, the best of `repeats` each, interleaved; both answers must be equal."""
    from hugerec.index import topk
    from hugerec.sparse.jagged import JaggedTensor
    from hugerec.training.ranking_metrics import csr_minus
    from hugerec.training.retrieval import all_item_vectors, user_vectors

    users, held, seen = loop._target(k)
    exclude = csr_minus(seen, held)  # the items met before, except those met again on window k (the gate's protocol)
    model = loop.load(loop.serving_version())
    empty = JaggedTensor(torch.zeros(0, dtype=torch.int64), torch.zeros(users.size, dtype=torch.int64))
    q, v = user_vectors(model, torch.from_numpy(users), empty), all_item_vectors(model)
    n, kk = model.num_items, loop.config.k

    def torch_keys(scores: torch.Tensor, first: int, m: int) -> torch.Tensor:
        return torch.topk(topk.encode(scores, first), m, dim=1).values

    ours_fn = topk._block_top_keys
    best: dict[str, float] = {}
    answers = {}
    for _ in range(repeats):
        for name, fn in (("hugerec-top_k", ours_fn), ("torch-topk-int64-keys", torch_keys)):
            topk._block_top_keys = fn  # type: ignore[assignment]  # the block selection the benchmark compares
            try:
                c0 = time.process_time()
                answers[name] = topk.top_k(lambda u0, u1, i0, i1: q[u0:u1] @ v[i0:i1].T, users.size, n, kk, exclude)
                best[name] = min(best.get(name, float("inf")), time.process_time() - c0)
            finally:
                topk._block_top_keys = ours_fn
    assert all(torch.equal(a, b) for a, b in zip(answers["hugerec-top_k"], answers["torch-topk-int64-keys"], strict=True))
    config = f"two_tower gate top-{kk}"
    print(f"{config}: {users.size} users x {n} items, top_k {best['hugerec-top_k'] * 1000:.1f} ms vs torch int64 keys "
          f"{best['torch-topk-int64-keys'] * 1000:.1f} ms CPU ({best['hugerec-top_k'] / best['torch-topk-int64-keys']:.2f}x); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    return [
        _record(config, "hugerec-top_k", best["hugerec-top_k"], "s", False, users=int(users.size), items=n,
                ratio_to_torch=best["hugerec-top_k"] / best["torch-topk-int64-keys"]),
        _record(config, "torch-topk-int64-keys", best["torch-topk-int64-keys"], "s", False),
    ]


def _publish_seconds(loop: Loop, stable: str, candidate: str, work: Path, cfg: StreamConfig) -> float:
    """Seconds to publish `candidate` (export its bundle, load it, make it the canary at share 0.1) to a server
    in this process that serves `stable` already."""
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN))
        export(loop.load(stable), work / "bench-stable", name="model", version="s", schema=cfg.schema)
        publisher.publish(work / "bench-stable", "stable", 0.1)
        t0 = time.perf_counter()
        export(loop.load(candidate), work / "bench-candidate", name="model", version="c", schema=cfg.schema)
        after = publisher.publish(work / "bench-candidate", "candidate", 0.1)
        seconds = time.perf_counter() - t0
    srv.close()
    assert after.get("canary") == "candidate", after
    return seconds


def intraday_drift_day(
    rows_per_day: int, epochs: int, minutes: int, seed: int = 0, recovery: Recovery | None = None
) -> list[dict[str, Any]]:
    """The loop on windows of `minutes` over days 3 and 4 (the same stream): how much of the concept-drift
    day a loop that runs within the day gets back. Day 4's holdout rows (those of `day 4 lift`) are each
    scored by the model serving during their window (published at the step of the window before, gated on
    their window's own holdout); the loop starts from scratch at day 3, 00:00. Also `retrain-since-drift`,
    what a loop could do at best with this model at this window length: before each of day 4's windows a
    fresh model trained (2 epochs, lr 1e-2, the best of a small grid on a 160,000-row learning curve) on
    every row of day 4 before that window."""
    cfg = StreamConfig(days=7, rows_per_day=rows_per_day, concept_drift_day=4, feature_shift_day=6, seed=seed)
    stream = Stream(cfg)
    windows = Windows(unit=WindowUnit.MINUTE, size=minutes)
    per_day = 1440 // minutes
    days = {d: stream.day(d) for d in (3, 4, 5)}
    parts = {d * per_day + w: windows.select(days[d].table, d * per_day + w) for d in (3, 4) for w in range(per_day)}
    parts[5 * per_day] = windows.select(days[5].table, 5 * per_day)  # day 5's first window: the last step's gate
    lc = LoopConfig(
        tempfile.mkdtemp(prefix="hugerec-intraday-"),
        cfg.schema,
        windows,
        SPEC,
        batch_size=512,
        lr=3e-3,
        epochs=epochs,
        recovery=recovery or Recovery(),
        keep_all_checkpoints=True,  # each window's rows are scored below by the model serving then
    )
    loop = Loop(lc, parts.__getitem__)
    serving_during: dict[int, str | None] = {}
    t0 = time.perf_counter()
    for k in range(3 * per_day, 5 * per_day):
        loop.step(k)
        serving_during[k + 1] = loop.serving_version()
    seconds = time.perf_counter() - t0
    day4 = days[4]
    held = holdout_mask(day4.table.num_rows, lc.holdout_share, lc.seed)  # day 4's daily holdout
    rows = day4.table.filter(pa.array(held))
    window = windows.index(rows[lc.windows.time_column].to_numpy())
    y, oracle = rows["label"].to_numpy(), day4.probability[held]
    hour = (window - 4 * per_day) * minutes // 60

    def day_lift(p: np.ndarray) -> tuple[float, dict[str, float]]:
        per_hour = {str(h): round(_lift(p[hour == h], y[hour == h], oracle[hour == h]), 4) for h in range(24)}
        return _lift(p, y, oracle), per_hour

    p = np.full(rows.num_rows, 0.5, np.float32)  # a window without a published model: one score for all
    for k in range(4 * per_day, 5 * per_day):  # day 4's first window is answered by day 3's last step's model
        version = serving_during[k]
        if version is not None:
            sel = window == k
            p[sel] = _scores(loop.load(version), rows.filter(pa.array(sel)), cfg)
    retrains = [f"{r.window}: {r.reason}" for r in loop.log.records if r.action == "retrain"]
    lift, per_hour = day_lift(p)
    method = f"hugerec-loop-{minutes}min"
    print(f"day 4 lift {method}: {lift:.4f}; per hour {per_hour}; retrains {retrains}", flush=True)
    out = [
        _record(
            "day 4 lift",
            method,
            lift,
            "share of oracle lift",
            True,
            auc=auc(p, y),
            rows=int(y.size),
            per_hour=per_hour,
            retrains=retrains,
            steps=2 * per_day,
            seconds_all_steps=seconds,
        )
    ]
    if minutes < 15:  # one fresh model per window on every earlier row of day 4: 288 of them at 5 minutes
        return out
    # the reference: day 4's first window is answered by a model trained on day 3 (no row of day 4 seen yet)
    train_cfg = TrainConfig(
        epochs=2, lr=1e-2, progress=False, tensorboard=False, plot=False, device="cpu", pipeline=False, seed=0
    )
    q = np.empty_like(p)
    t0 = time.perf_counter()
    for k in range(4 * per_day, 5 * per_day):
        seen = days[3].table if k == 4 * per_day else pa.concat_tables([parts[j] for j in range(4 * per_day, k)])
        model = SPEC.build(cfg.schema, 0)
        fit(
            model.train(),
            table_batches(loop._train_rows(seen), cfg.schema, 512, shuffle=True, seed=k),
            config=train_cfg,
        )
        sel = window == k
        q[sel] = _scores(model.eval(), rows.filter(pa.array(sel)), cfg)
    ceiling, ceiling_hours = day_lift(q)
    print(f"day 4 lift retrain-since-drift ({minutes} min): {ceiling:.4f}; per hour {ceiling_hours}", flush=True)
    out.append(
        _record(
            "day 4 lift",
            f"retrain-since-drift-{minutes}min",
            ceiling,
            "share of oracle lift",
            True,
            auc=auc(q, y),
            per_hour=ceiling_hours,
            seconds=time.perf_counter() - t0,
        )
    )
    return out


def _inverted(table: pa.Table, config: LoopConfig) -> pa.Table:
    """The window with its training rows' labels flipped (its holdout keeps the true ones): a worse canary."""
    labels = table["label"].to_numpy().copy()
    train = ~holdout_mask(table.num_rows, config.holdout_share, config.seed)
    labels[train] = 1 - labels[train]
    return table.set_column(table.column_names.index("label"), "label", pa.array(labels))


def week_load(rows_per_day: int) -> list[dict[str, Any]]:
    """The loop publishing to a server in this process for 7 windows while a thread keeps requesting; days 1
    and 4 are trained from scratch on inverted labels (worse canaries to roll back); 1,600 of each day's users
    are replayed with their true labels as feedback before the loop's step on that day."""
    cfg = StreamConfig(days=8, rows_per_day=rows_per_day, num_sparse=4, num_dense=2, vocabulary=500, seed=3)
    work = Path(tempfile.mkdtemp(prefix="hugerec-week-"))
    lc = LoopConfig(
        str(work / "loop"),
        cfg.schema,
        model=ModelSpec(DLRMConfig(bottom=(8, 4), top=(8, 1)), dim=4, optimizer=Adagrad(lr=0.1), capacity=4000),
        batch_size=128,
        lr=1e-2,
        epochs=2,
        gate=GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0),
        decisions=DecisionConfig(min_feedback=100, kpi_margin=0.15, psi_alarm=10.0, baseline_margin=0.1),
        canary_share=0.5,
    )
    stream = Stream(cfg)
    truth = [stream.day(d).table for d in range(8)]
    broken = (1, 4)
    trained = [_inverted(t, lc) if d in broken else t for d, t in enumerate(truth)]
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    srv.enable_request_log(RequestLogConfig(str(work / "requests"), seed=0))
    replayed = Replay()
    t0 = time.perf_counter()
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN))
        observer = ServerObserver(publisher, work / "requests", lc.work_dir, cfg.dense_names, cfg.sparse_names)
        loop = Loop(lc, trained.__getitem__, publisher, observer)

        def step(d: int) -> None:
            if d in broken:  # a retrain record makes the loop train window d from scratch
                loop.log.append(Record(d, "retrain", "benchmark: a broken candidate", extra={"windows": 1}))
            loop.step(d)

        step(0)
        with BackgroundLoad(url, "model", instances(truth[0].slice(0, 200), cfg.schema)) as load:
            step(1)
            for d in range(2, 7):
                seen = replay(url, "model", truth[d].slice(0, 1600), cfg.schema, batch=40, token=TOKEN)
                replayed.answered.update(seen.answered)
                replayed.failed += seen.failed
                step(d)
    srv.close()
    seconds = time.perf_counter() - t0
    records = loop.log.records
    outside = load.outside(live_intervals(records))
    decisions = [
        f"{r.window}:{r.action}:{r.version}" for r in records if r.action in ("publish", "promote", "rollback")
    ]
    print(f"week load: {len(load.answers)} background answers, {len(load.failed)} failed; {decisions}", flush=True)
    extra = {
        "background_answered": len(load.answers),
        "background_versions": dict(sorted(load.versions().items())),
        "replay_answered": sum(replayed.answered.values()),
        "replay_failed": replayed.failed,
        "answers_outside_live_versions": len(outside),
        "decisions": decisions,
        "seconds": seconds,
        "rows_per_day": rows_per_day,
    }
    return [
        _record(
            "week load", "hugerec-loop", float(len(load.failed) + replayed.failed), "failed requests", False, **extra
        )
    ]


def monitor_time(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    cols: dict[str, Any] = {}
    numeric = [f"n{j}" for j in range(20)]
    categorical = [f"c{j}" for j in range(20)]
    ref_cols: dict[str, Any] = {}
    for j, name in enumerate(numeric):
        ref_cols[name] = rng.standard_normal(n).astype(np.float32)
        cols[name] = (rng.standard_normal(n) + (0.5 if j == 0 else 0.0)).astype(np.float32)
    for name in categorical:
        ref_cols[name] = (rng.zipf(1.3, n) % 100_000).astype(np.int64)
        cols[name] = (rng.zipf(1.3, n) % 100_000).astype(np.int64)
    cols["prediction"] = rng.random(n).astype(np.float32)
    cols["label"] = (rng.random(n) < cols["prediction"]).astype(np.float32)
    cols["version"] = np.where(rng.random(n) < 0.1, "canary", "stable")
    reference, current = pa.table(ref_cols), pa.table(cols)
    t0 = time.perf_counter()
    ref = Reference.of(reference, numeric, categorical, MonitorConfig(), rng.random(n))
    rep = report(0, ref, current, {"stable": "stable", "canary": "canary"}, current)
    ours = time.perf_counter() - t0
    assert rep.psi["n0"] > 0.1 and len(rep.kpis) == 2
    t0 = time.perf_counter()
    for name in (*numeric, *categorical):
        ks_2samp(reference[name].to_numpy(), current[name].to_numpy())
    ks = time.perf_counter() - t0
    return [
        _record("monitor time", "hugerec-monitor", ours, "s", False, rows=n, features=40, ratio_to_scipy_ks=ours / ks),
        _record("monitor time", "scipy-ks", ks, "s", False, rows=n, features=40),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30,000 rows a day, 200,000 monitor rows")
    ap.add_argument("--json", type=Path, help="write the records here")
    ap.add_argument("--rows-per-day", type=int, default=None, help="default 1,000,000 (the issue's size)")
    ap.add_argument("--monitor-rows", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--week-load-rows", type=int, default=6000, help="rows a day of the week under load (0: skip it)")
    ap.add_argument("--week-load-only", action="store_true", help="run only the week under load")
    ap.add_argument(
        "--intraday",
        type=int,
        nargs="+",
        default=[],
        metavar="MINUTES",
        help="also the loop on windows of MINUTES (e.g. 60 15) over days 3 and 4, and the retrain-since-drift "
        "reference (meaningful at the full size: at --quick's 30,000 rows a day an hour has 1,250 rows)",
    )
    ap.add_argument("--intraday-only", action="store_true", help="run only the --intraday loops")
    ap.add_argument(
        "--two-tower-only",
        action="store_true",
        help="run only the two-tower loop's week on the drifting interaction stream (3,000 users x 1,500 items; "
        "--quick: 1,000 x 500)",
    )
    ap.add_argument(
        "--two-tower-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of configs/loop_two_tower.toml for the two-tower week (e.g. loop.warm_start_epochs=2)",
    )
    ap.add_argument(
        "--two-tower-repeats",
        type=int,
        default=None,
        help="loops of the two-tower week run side by side, each time the median of theirs (default 3; --quick: 1)",
    )
    ap.add_argument(
        "--config-week-rows",
        type=int,
        default=None,
        help="rows a day of the week of configs/loop_synthetic.toml (default: the config's 20,000; --quick: 10,000)",
    )
    ap.add_argument(
        "--config-week-only",
        action="store_true",
        help="run only the week of configs/loop_synthetic.toml with the DLRM and the DCN-v2 loop "
        "(its 20,000 rows a day; --quick: 10,000)",
    )
    ap.add_argument(
        "--intraday-seed",
        type=int,
        default=0,
        help="the stream's seed for --intraday (another seed than the reported 0: a validation stream to choose "
        "the recovery settings on)",
    )
    ap.add_argument("--recovery-growth", type=float, default=None, help="Recovery.growth for --intraday")
    ap.add_argument("--recovery-hours", type=float, default=None, help="Recovery.hours for --intraday")
    args = ap.parse_args()
    if any(m < 1 or 1440 % m for m in args.intraday):
        ap.error(f"--intraday: each window length must divide a day of 1440 minutes, got {args.intraday}")
    if args.intraday_only and not args.intraday:
        ap.error("--intraday-only needs --intraday MINUTES")
    if args.two_tower_repeats is not None and args.two_tower_repeats < 1:
        ap.error(f"--two-tower-repeats must be >= 1, got {args.two_tower_repeats}")
    # every loop's work folder goes here and is deleted at the end: checkpoints take GBs (576 of 20 MB at 5 minutes)
    with tempfile.TemporaryDirectory(prefix="hugerec-continuous-bench-") as scratch:
        tempfile.tempdir = scratch
        try:
            _main(args)
        finally:
            tempfile.tempdir = None


def _main(args: argparse.Namespace) -> None:
    rows = args.rows_per_day or (30_000 if args.quick else 1_000_000)
    mrows = args.monitor_rows or (200_000 if args.quick else 1_000_000)
    only = args.week_load_only or args.intraday_only or args.config_week_only or args.two_tower_only
    records = [] if only else run(rows, mrows, args.epochs)
    if not (args.week_load_only or args.intraday_only or args.two_tower_only):
        records += config_week(args.config_week_rows or (10_000 if args.quick else None))
    if not (args.week_load_only or args.intraday_only or args.config_week_only):
        repeats = (1 if args.quick else 3) if args.two_tower_repeats is None else args.two_tower_repeats
        records += two_tower_week(*((1000, 500) if args.quick else (3000, 1500)), tuple(args.two_tower_set), repeats)
    for minutes in args.intraday:
        recovery = Recovery(growth=args.recovery_growth or Recovery.growth, hours=args.recovery_hours or Recovery.hours)
        records += intraday_drift_day(rows, args.epochs, minutes, args.intraday_seed, recovery)
    if args.week_load_rows > 0 and not (args.intraday_only or args.config_week_only or args.two_tower_only):
        records += week_load(args.week_load_rows)
    sizes = "" if args.week_load_only or args.config_week_only or args.two_tower_only else f"rows per day {rows:,}, epochs {args.epochs}, monitor rows {mrows:,}; "
    week = "" if args.intraday_only or args.config_week_only or args.two_tower_only else f"week load rows per day {args.week_load_rows:,}; "
    print(f"\n{sizes}{week}load {os.getloadavg()[0]:.1f}")
    print(f"{'config':<20} {'method':<16} {'value':>10}  unit")
    for r in records:
        print(f"{r['config']:<20} {r['method']:<16} {r['value']:>10.4f}  {r['unit']}")
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
