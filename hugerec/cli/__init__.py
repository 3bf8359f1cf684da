"""The `hugerec` command: thin argparse over hugerec.cli.commands; user mistakes are one line and exit 2."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hugerec.cli.config_file import ConfigError
from hugerec.cli.pipeline_commands import add_parser as pipeline_parser
from hugerec.cli.up_command import add_parser as up_parser

if TYPE_CHECKING:  # the commands import torch and the data stack lazily: `hugerec --help` stays instant
    from hugerec.cli.run_config import RunConfig

USAGE_ARGS = "[CONFIG.toml] [KEY=VALUE ...]"

DESCRIPTION = """\
hugerec: train recommender models with huge embedding tables, on a CPU or a GPU.

Start with `hugerec quickstart`: it generates a small synthetic click log, preprocesses it,
trains a DLRM, evaluates it and compares its AUC with the best AUC possible on that data.
Then point a config at your own data: `hugerec schema clicks.csv --out my.toml` writes the
[preprocess] section from a sample of the file, for you to check and run.
"""

CONFIG_HELP = """\
Every command reads a TOML config (sections [synth], [preprocess], [data], [embedding], [model],
[train], [predict]; for retrieval and sequential models, whose events are [preprocess]'s declared
input, [interactions] or [sequences], [index], [recommend]; see configs/*.toml). Without a config file the quickstart's settings are used.
Override any key on the command line with dotted KEY=VALUE pairs, typed like the config:
  train.lr=0.01  train.max_steps=none  model.top=[256,64,1]  train.precision=bf16
A config path `configs/NAME.toml` that is not in the current directory is read from the checkout's
configs/. Relative input paths are looked up in the current directory, then next to the config file;
`$HUGEREC_DATA` in a path is that environment variable, or else the shared/data folder found above the
config file or the current directory (where the real data samples sit beside a checkout).
Set HUGEREC_DEBUG=1 to see a full traceback instead of a one-line error."""

COMMANDS = {
    "quickstart": (
        "synthetic data -> preprocess -> train DLRM -> evaluate, in a few minutes",
        "Runs synth, preprocess, train and evaluate in a row and prints the model's AUC next to the\n"
        "oracle AUC (the best any model can reach on these synthetic labels). Writes everything under\n"
        "runs/quickstart/: the data, model.pt, metrics.jsonl, curves.png and TensorBoard scalars.\n"
        "example: hugerec quickstart synth.rows=3000000 model.type=dcn_v2",
    ),
    "synth": (
        "generate a synthetic click log ([synth])",
        "Writes Parquet shards to synth.out, with schema.json and synthetic.json (holding the oracle AUC).\n"
        'Presets: "criteo-like" (13 dense + 26 sparse features, Criteo Kaggle vocabularies) and\n'
        '"seed-synthetic" (100 multi-hot fields).\n'
        "example: hugerec synth synth.rows=2000000 synth.out=runs/big/raw",
    ),
    "preprocess": (
        "raw rows -> fitted workflow -> train/eval Parquet shards ([preprocess])",
        "Reads preprocess.input as declared: format = \"csv\" (any separator, \"::\" included; header or not;\n"
        "encoding; plain or .gz) with preprocess.columns (name, type, role; `hugerec schema FILE` writes them),\n"
        "\"parquet\" (columns from the files) or \"criteo\"; joins [[preprocess.join]] side tables; splits the\n"
        "rows (preprocess.split = random | time | leave_last_out | files); fits the workflow on the train part\n"
        "only ([[preprocess.ops]], or by default: normalize the dense features, map categorical values to ids\n"
        "by frequency) and writes preprocess.out/{train,eval}/ (test/ with preprocess.test_input, or with\n"
        "preprocess.test_split = true: a test part held out by the split's rule once more), schema.json\n"
        "and the fitted workflow/ (for serving, and for evaluate / predict on raw files).\n"
        "preprocess.header says whether the input's files start with a header line; eval_header and\n"
        "test_header say it for eval_input and test_input (default: as header).\n"
        "preprocess.on_error = \"skip\" drops bad rows and reports how many, with the first few.\n"
        "example: hugerec preprocess configs/criteo_sample.toml\n"
        "example: hugerec preprocess configs/movielens_1m_ctr.toml preprocess.holdout=1",
    ),
    "train": (
        "train a model on preprocessed shards ([data], [embedding], [model], [train])",
        "Trains the [model] on data.train, evaluates on data.eval, and writes model.pt, metrics.jsonl,\n"
        "curves.png, tensorboard/ and checkpoints/ to train.out_dir.\n"
        "Evaluates every train.eval_every steps (default: each epoch) and keeps the best evaluation by\n"
        "train.early_stopping.metric (auc: higher is better, logloss: lower; recall@K, ndcg@K for retrieval\n"
        "and sequential models, their default recall@10) as best.pt beside model.pt\n"
        "(the last weights; the best by any margin); stops after train.early_stopping.patience evaluations\n"
        "without a gain of more than train.early_stopping.min_delta (none: never stops early).\n"
        "Prints the model, its parameter count, the rows, the batch and the steps per epoch first.\n"
        "Defaults meant for small data too: data.batch_size = \"auto\" (2 * sqrt(train rows), 32 to 2048),\n"
        "MLP widths the [model] leaves out capped at the same rule (64 to 1024; a DLRM without dense\n"
        "features gets model.bottom = []), each change printed; keys you set stay as set;\n"
        "the dense lr (train.lr) decays linearly to 0 over the first epoch (train.schedule.decay_epochs = 1;\n"
        "retrieval and sequential models keep it constant);\n"
        "on a small set give train.epochs an upper bound (e.g. 20) and let early stopping end the run.\n"
        "Continue an interrupted run exactly where it stopped with train.resume=true.\n"
        "Retrieval (model.type = two_tower | mf) takes one history per user from [preprocess]'s declared\n"
        "input (roles user, item, timestamp), held out by preprocess.split (leave-last-out per user or a\n"
        "time split), trains with the model's loss (sampled softmax or BPR) and reports\n"
        "Recall/NDCG/MRR/HitRate/coverage@K over the full catalogue (training items excluded).\n"
        "Sequential (model.type = sasrec | mlm | gru4rec) groups the events by the session or user column\n"
        "([sequences]; or an inactivity gap), evaluated leave-last-out or on every prefix of the test\n"
        "sessions. Both train through the same trainer on the training part less a validation split cut\n"
        "the same way (early stopping on it; restore_best keeps the best epoch in model.pt), and write\n"
        "model.pt and metrics.json to train.out_dir; under torchrun the id tables are sharded row-wise.\n"
        "Gradient-boosted trees (model.type = lightgbm | xgboost; pip install 'hugerec[gbm]') train on the\n"
        "same shards, stop early on data.eval after model.early_stopping_rounds rounds without a better\n"
        "train.early_stopping.metric, and write model.txt (LightGBM) or model.json (XGBoost) to train.out_dir.\n"
        "example: hugerec train configs/criteo_sample.toml model.type=dcn_v2 train.epochs=2\n"
        "example: hugerec train configs/criteo_sample.toml model.type=lightgbm\n"
        "example: hugerec train configs/movielens_two_tower.toml train.epochs=2",
    ),
    "evaluate": (
        "AUC, logloss and calibration of a trained model on data.eval",
        "Loads train.out_dir/best.pt (the best evaluation of training; model.pt when there is none)\n"
        "or --model, and scores data.eval (shards, or raw files read as [preprocess] reads its input and run\n"
        "through the fitted workflow, label column included): exact AUC over all rows,\n"
        "logloss and calibration (mean predicted click rate / observed click rate).\n"
        "Retrieval and sequential models: the held-out part of [interactions] / [sequences], split as in\n"
        "training, ranked over the whole catalogue: Recall, NDCG, MRR, HitRate and coverage at each K.\n"
        "example: hugerec evaluate configs/criteo_sample.toml data.eval=other/eval\n"
        "example: hugerec evaluate configs/movielens_sasrec.toml",
    ),
    "predict": (
        "score rows into a Parquet file of click probabilities",
        "Scores predict.input (default: data.eval; shards, or raw files with the training columns, with or\n"
        "without the label, run through the fitted workflow) with train.out_dir/best.pt (the best evaluation\n"
        "of training; model.pt when there is none) or --model, and writes\n"
        "predict.out (default: train.out_dir/predictions.parquet): the label (when the rows have one) and the\n"
        "probability per row.\n"
        "example: hugerec predict configs/criteo_sample.toml predict.out=scores.parquet",
    ),
    "export": (
        "trained model -> serving bundle (dense program, embedding rows, workflow, manifest)",
        "Exports train.out_dir/best.pt (the best evaluation of training; model.pt when there is none)\n"
        "or --model to --out (default: train.out_dir/bundle): the dense part\n"
        "as a torch.export program, the embedding rows in a RocksDB store, the fitted preprocessing workflow\n"
        "(preprocess.out/workflow, when present, so /predict takes raw rows) and a manifest with checksums.\n"
        "Sequential models (sasrec, mlm, gru4rec) export a next-items bundle instead: the server answers\n"
        "KServe v2 requests with an INT64 item list (\"items\" [N] + \"items.lengths\" [B]) by the top\n"
        "recommend.k next items (\"items\", \"scores\", \"unknown_items\"), scored exactly over the catalogue;\n"
        "an HSTU trained with model.times = true also takes each item's seconds (\"items.times\", INT64 [N]).\n"
        "example: hugerec export configs/quickstart.toml && hugerec serve runs/quickstart/bundle\n"
        "example: hugerec export configs/yoochoose_sasrec.toml && hugerec serve runs/yoochoose_sasrec/bundle",
    ),
}

COMMANDS["index"] = (
    "item vectors of a retrieval / sequential model -> an exact or HNSW index ([index])",
    "Reads train.out_dir/model.pt (or --model), embeds every item of the catalogue and builds\n"
    'index.kind = "exact" (blocked matmul + top-k) or "hnsw" (usearch graph for the inner product) into\n'
    "--out (default: index.out, else train.out_dir/index). The ids in the index are the model's dense\n"
    "item ids; `hugerec recommend ... recommend.use_index=true` answers from it.\n"
    "example: hugerec index configs/movielens_two_tower.toml index.kind=hnsw",
)
COMMANDS["recommend"] = (
    "top-K items for given users or histories -> Parquet ([recommend])",
    "Retrieval models: --users 1,2,3 (raw user ids; recommend.users_file for a file of ids), each\n"
    "user's training items excluded; a user the model never saw gets the most popular items, marked\n"
    "source = popularity in the output and counted on stderr. Sequential models: --history 1,2,3\n"
    "(raw item ids, oldest first; recommend.history_file for one history per line): unknown items are\n"
    "skipped and counted (column unknown_items); histories longer than model.max_len keep their last\n"
    "max_len items. An HSTU trained with model.times = true also needs --history-times (each item's time in\n"
    "seconds, recommend.history_times). k larger than the catalogue is an error. Writes --out (default recommend.out, else\n"
    "train.out_dir/recommendations.parquet): user or history, rank, item, score, source.\n"
    "example: hugerec recommend configs/movielens_two_tower.toml --users 1,2,3 --k 10\n"
    "example: hugerec recommend configs/movielens_sasrec.toml --history 1193,661,914 --k 10",
)

LOOP_HELP = """\
Runs the continuous-training loop of a TOML config ([loop], [data], [windows], [model], [gate],
[decisions], [monitor], [recovery], [server]; see configs/loop_synthetic.toml): for each time window
it warm-starts from the last published checkpoint, trains on the window, gates the candidate on the
next window's holdout against the serving model, publishes it as a canary, and promotes, rolls back,
retrains from scratch (a feature drifted) or recovers from a concept drift on what the monitor sees. Prints the decision log (work_dir/decisions.jsonl)
as a table; --log prints it without running. Run the same command again after a stop to continue.
With model.type = "two_tower" or "mf" it runs the retrieval loop (configs/loop_two_tower.toml): gated on
Recall@K, each candidate published as a recommendation pipeline with an ANN index built afresh, as the canary.
example: hugerec loop configs/loop_synthetic.toml
example: hugerec loop configs/loop_synthetic.toml --log
example: hugerec loop configs/loop_two_tower.toml"""
SCHEMA_HELP = """\
Reads the first few MB of FILE (CSV/TSV/"::"-separated text, plain or .gz, or Parquet), guesses the
separator, whether line 1 is a header, the encoding (UTF-8, else latin-1), each column's type (int,
float, string, list of "|"-separated values, timestamp) and role (label, dense, categorical,
timestamp), and prints the [preprocess] section of a config with a few sample values per column.
Save it (--out), check the types and roles (integer ids read as "dense" until you say "categorical",
"user" or "item"), add [data] / [model] / [train] sections, then run `hugerec preprocess` and `hugerec train`.
example: hugerec schema clicks.csv --out my_data.toml"""

SERVE_HELP = """\
Serves exported bundles (`hugerec export`) over HTTP until Ctrl-C: the Open Inference Protocol v2
used by KServe and Triton (/v2/health/live, /v2/models/NAME, /v2/models/NAME/infer; the official
tritonclient works against it), /predict for raw feature rows, and Prometheus /metrics.
Binds 127.0.0.1 unless --host says otherwise. The admin API (load, canary, promote, roll back) and
POST /recommend/features take the admin token ($HUGEREC_ADMIN_TOKEN), POST /feedback and
POST /recommend/interactions the ingest token ($HUGEREC_INGEST_TOKEN) or the admin one; without a
token those routes are off. Request limits (README: "Serving limits") have safe defaults; change one
with --limit NAME=VALUE, e.g. --limit max_users=64 --limit header_timeout_s=5.
Pipeline bundles (`hugerec pipeline build`) are served beside model bundles: POST /recommend
{"user": 1, "k": 10} and the KServe v2 model of the pipeline's name. --state-dir, --redis-url and
--updates-dir/--updates-stream concern model bundles (and a pipeline's ranker), --max-delay-ms model and
GBM bundles: one that no bundle given reads is refused.
Open http://127.0.0.1:8000/ in a browser for the status page: what is served and, with the admin token,
versions, canary share, request rate and latency, and a `hugerec loop`'s recent decisions (--decision-log).
example: hugerec serve runs/quickstart/bundle --port 8000"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # config and KEY=VALUE words may also follow options (`recommend CONFIG --users 1,2 k=v`)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "args") or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = [*args.args, *extra]
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "serve":
        return _serve(args)
    if args.command == "loop":
        return _loop(args)
    if args.command == "schema":
        return _schema(args)
    if args.command == "pipeline":
        from hugerec.cli.pipeline_commands import run as run_pipeline

        return run_pipeline(args)
    if args.command == "up":
        from hugerec.cli.up_command import run as run_up

        return run_up(args)
    try:
        from hugerec.cli.run_config import load_run_config, resolved_dict

        config_path, overrides = _split_args(args.args)
        cfg = load_run_config(config_path, [*overrides, *_recommend_overrides(args)])
        if args.print_config:  # every key, unset ones as null: the full list of what a config may say
            print(json.dumps(resolved_dict(cfg), indent=1, default=str))
            if args.command == "train" and cfg.family.value == "ranking":  # what "auto" comes to on this data
                from hugerec.cli.commands import auto_values

                for line in auto_values(cfg):
                    print(f"# {line}", file=sys.stderr)
            return 0
        run: Callable[[RunConfig, argparse.Namespace], None] = RUNNERS[args.command]
        run(cfg, args)
        return 0
    except (ConfigError, ValueError, FileNotFoundError, FloatingPointError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        message = " ".join(str(e).split())  # one line, whatever the message
        print(f"hugerec {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hugerec {args.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hugerec",
        description=DESCRIPTION,
        epilog=CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, (summary, details) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=summary,
            description=f"{summary}\n\n{details}",
            epilog=CONFIG_HELP,
            usage=f"hugerec {name} {USAGE_ARGS}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("args", nargs="*", metavar="CONFIG.toml | KEY=VALUE", help="a config file and/or overrides")
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        if name in ("evaluate", "predict", "export"):
            p.add_argument(
                "--model",
                type=Path,
                help="model file (default: train.out_dir/best.pt, the best evaluation; model.pt when there is none; "
                "retrieval and sequential models: train.out_dir/model.pt)",
            )
        if name in ("index", "recommend"):
            p.add_argument("--model", type=Path, help="model file (default: train.out_dir/model.pt)")
        if name == "export":
            p.add_argument("--out", type=Path, help="bundle directory (default: train.out_dir/bundle)")
        if name == "index":
            p.add_argument("--out", type=Path, help="index folder (default: index.out, else train.out_dir/index)")
        if name == "recommend":
            p.add_argument("--users", help="comma-separated raw user ids (retrieval models)")
            p.add_argument("--history", help="comma-separated raw item ids, oldest first (sequential models)")
            p.add_argument("--history-times", help="comma-separated seconds, one per --history item (an HSTU trained with model.times = true)")
            p.add_argument("--k", type=int, help="items per user / history (default: recommend.k)")
            p.add_argument("--out", help="Parquet file (default: recommend.out, else train.out_dir/recommendations.parquet)")
    loop = sub.add_parser(
        "loop",
        help="continuous training: windows -> train -> gate -> canary -> promote / roll back",
        description=LOOP_HELP,
        usage=f"hugerec loop {USAGE_ARGS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loop.add_argument("args", nargs="*", metavar="CONFIG.toml | KEY=VALUE", help="a config file and/or overrides")
    loop.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    loop.add_argument("--log", action="store_true", help="print the decision log as a table and exit")
    schema = sub.add_parser(
        "schema",
        help="guess a raw file's columns and write the [preprocess] section for you to edit",
        description=SCHEMA_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schema.add_argument("file", type=Path, metavar="FILE", help="a raw data file (text, plain or .gz, or Parquet)")
    schema.add_argument("--separator", help='field separator (default: guessed among tab, "::", ",", ";", "|")')
    header = schema.add_mutually_exclusive_group()
    header.add_argument("--header", dest="header", action="store_true", default=None, help="line 1 is a header")
    header.add_argument("--no-header", dest="header", action="store_false", help="line 1 is data")
    schema.add_argument("--encoding", default="utf-8", help="text encoding (default: utf-8, else latin-1 when not UTF-8)")
    schema.add_argument("--out", type=Path, help="write the TOML here (default: print it)")
    pipeline_parser(sub)
    up_parser(sub)
    serve = sub.add_parser(
        "serve",
        help="serve exported bundles over HTTP (KServe v2 / Triton protocol)",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("bundles", nargs="+", type=Path, metavar="BUNDLE", help="bundle directories to serve")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for scoring (default: 1; idle torch threads spin and cost CPU on every batch-1 request; "
        "raise it for large batches, or run more replicas)",
    )
    serve.add_argument("--updates-dir", help="apply the deltas published to this directory while serving")
    serve.add_argument("--redis-url", help="keep tier 2 (all rows) in this Redis server, shared by replicas")
    serve.add_argument("--updates-stream", help="also apply updates from this Redis stream (of --redis-url)")
    serve.add_argument("--state-dir", help="RocksDB tier and kept dense weights (default: BUNDLE/state)")
    serve.add_argument("--max-delay-ms", type=float, default=None, help="dynamic batching: wait this long to merge")
    serve.add_argument("--admin-token", default=os.environ.get("HUGEREC_ADMIN_TOKEN"), help=argparse.SUPPRESS)
    serve.add_argument("--ingest-token", default=os.environ.get("HUGEREC_INGEST_TOKEN"), help=argparse.SUPPRESS)
    serve.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a request limit (repeatable; names and defaults in the README's serving limits table)",
    )
    serve.add_argument(
        "--load-deadline",
        type=float,
        default=None,
        help="seconds an admin load of a bundle may take, and a GBM model file's check by its library in a child "
        "process (default: 120); past it the load is refused and the server keeps serving",
    )
    serve.add_argument(
        "--request-log",
        help="log /predict rows and their feedback (POST /feedback) as Parquet in this folder (for `hugerec loop`)",
    )
    serve.add_argument(
        "--decision-log",
        help="a `hugerec loop`'s decisions.jsonl (in its work_dir): the status page at / shows its recent "
        "decisions and drift figures (read only)",
    )
    return parser


def _recommend_overrides(args: argparse.Namespace) -> list[str]:
    """recommend's --users / --history / --k / --out as the [recommend] overrides they stand for."""
    if args.command != "recommend":
        return []
    out = []
    for flag, key in (("users", "users"), ("history", "history"), ("history_times", "history_times")):
        value = getattr(args, flag)
        if value is not None:
            ids = [v.strip() for v in value.split(",") if v.strip()]
            for v in ids:
                if not v.lstrip("-").isdigit() or len(v) > 20:
                    what = "a time in seconds" if key == "history_times" else "an integer id"
                    raise ConfigError(f"--{flag.replace('_', '-')}: {v[:30]!r} is not {what} (give comma-separated integers, e.g. 1,2,3)")
            out.append(f"recommend.{key}=[{','.join(ids)}]")
    if args.k is not None:
        out.append(f"recommend.k={args.k}")
    if args.out is not None:
        out.append(f"recommend.out={json.dumps(args.out)}")
    return out


def _split_args(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """One optional config file (any argument without '=') and KEY=VALUE overrides, in any order."""
    configs = [a for a in items if "=" not in a]
    for a in configs:
        if not a.endswith(".toml") and not Path(a).exists():
            raise ConfigError(f"{a!r} is neither a config file nor a KEY=VALUE override (e.g. train.lr=0.01)")
    if len(configs) > 1:
        raise ConfigError(f"expected one config file, got {configs}; overrides are KEY=VALUE")
    return (configs[0] if configs else None), [a for a in items if "=" in a]


# -- the commands, printing what they did -------------------------------------------------------
def _synth(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import synth

    t0 = time.perf_counter()
    report = synth(cfg)
    oracle = ", ".join(f"{k} {v:.4f}" for k, v in report.oracle_auc.items())
    print(f"synth: {report.num_rows:,} rows -> {cfg.synth.out} ({time.perf_counter() - t0:.1f} s); oracle AUC {oracle}")


def _preprocess(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import preprocess

    t0 = time.perf_counter()
    r = preprocess(cfg)
    print(
        f"preprocess: {r.train_rows:,} train + {r.eval_rows:,} eval + {r.test_rows:,} test rows -> {cfg.preprocess.out} "
        f"({time.perf_counter() - t0:.1f} s); schema {r.schema}, workflow {r.workflow}"
    )
    if r.skipped.rows_skipped:
        print(f"preprocess: {r.skipped}")


def _is_task(cfg: RunConfig) -> bool:
    """A retrieval or sequential model (its data are views of the declared input, its commands task_commands')."""
    return cfg.family.value in ("retrieval", "sequential")


def _print_metrics(prefix: str, metrics: dict[str, float]) -> None:
    print(f"{prefix}{json.dumps({k: _finite(round(v, 6)) for k, v in metrics.items()})}")


def _is_gbm(cfg: RunConfig) -> bool:
    return cfg.family.value == "trees"


def _train_trees(cfg: RunConfig) -> None:
    from hugerec.cli.gbm_commands import default_tree_model, train_trees

    history = train_trees(cfg)
    last = history.final_eval
    if last is None:
        result = ""
    elif "auc" in last:
        result = f"; eval AUC {last['auc']:.4f} logloss {last['logloss']:.4f}"
    else:  # a ranking objective: NDCG@K, MAP@K, MRR@K per query
        result = "; eval " + " ".join(f"{k} {v:.4f}" for k, v in last.items() if "@" in k)
    stopped = " (stopped early)" if history.stopped_early else ""
    print(
        f"train: {history.rounds} rounds in {history.seconds:.1f} s{stopped}, best round {history.best_round}{result}"
    )
    model = default_tree_model(cfg)
    plot = "" if history.plot is None else f"   plot {history.plot}"
    print(f"  model {model} (the best round's trees)   log {cfg.out_dir / 'metrics.jsonl'}{plot}")


def _train(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import train

    if _is_gbm(cfg):
        _train_trees(cfg)
        return
    if _is_task(cfg):
        from hugerec.cli.task_commands import is_retrieval, train_retrieval, train_sequential

        t0 = time.perf_counter()
        metrics = train_retrieval(cfg) if is_retrieval(cfg) else train_sequential(cfg)
        if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 speaks for every rank
            return
        print(f"train: done in {time.perf_counter() - t0:.1f} s; held-out metrics (full ranking):")
        _print_metrics("  ", metrics)
        print(f"  model {cfg.out_dir / 'model.pt'}   metrics {cfg.out_dir / 'metrics.json'}")
        return

    t0 = time.perf_counter()
    history = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 speaks for every rank
        return
    last = history.final_eval
    result = "" if last is None else f"; eval AUC {last['auc']:.4f} logloss {last['logloss']:.4f}"
    stopped = " (stopped early)" if history.stopped_early else ""
    print(f"train: {history.steps:,} steps in {time.perf_counter() - t0:.1f} s{stopped}{result}")
    best = history.best_eval
    if best is not None and history.best_checkpoint is not None:
        print(
            f"  best eval AUC {best['auc']:.4f} logloss {best['logloss']:.4f} at step {best['step']:.0f} "
            f"(epoch {best['epoch']:.0f}) -> {cfg.out_dir / 'best.pt'} (what evaluate / predict / export use)"
        )
    print(f"  model {cfg.out_dir / 'model.pt'}   log {cfg.out_dir / 'metrics.jsonl'}   plot {history.plot}")


def _evaluate(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import evaluate_model

    if _is_task(cfg):
        from hugerec.cli.task_commands import evaluate_task

        _print_metrics("", evaluate_task(cfg, args.model))
        return

    if _is_gbm(cfg):
        from hugerec.cli.gbm_commands import evaluate_trees_cmd

        metrics = evaluate_trees_cmd(cfg, args.model)
    else:
        metrics = evaluate_model(cfg, args.model)
    print(json.dumps({k: _finite(v) for k, v in metrics.items()}))


def _predict(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import predict_to_parquet

    if _is_gbm(cfg):
        from hugerec.cli.gbm_commands import predict_trees

        out, rows = predict_trees(cfg, args.model)
    else:
        out, rows = predict_to_parquet(cfg, args.model)
    print(f"predict: {rows:,} rows scored -> {out}")


def _export(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import export_model

    out = export_model(cfg, args.model, args.out)
    kind = {"sequential": "next-items bundle", "trees": "GBM bundle"}.get(cfg.family.value, "bundle")
    print(f"export: {kind} -> {out}   (serve it: hugerec serve {out})")


def _index(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.task_commands import build_item_index

    if not _is_task(cfg):
        raise ConfigError(f"index: model.type = {cfg.model_type!r} has no item vectors; use a two_tower, mf, sasrec, mlm or gru4rec config")
    t0 = time.perf_counter()
    folder, n, dim = build_item_index(cfg, args.model, args.out)
    print(f"index: {cfg.index.kind.value} index of {n:,} items x {dim} -> {folder} ({time.perf_counter() - t0:.1f} s)")


def _recommend(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.task_commands import recommend_to_parquet, warn

    if not _is_task(cfg):
        raise ConfigError(f"recommend: model.type = {cfg.model_type!r} is a {cfg.family.value} model; use `hugerec predict`")
    out, rows, notes = recommend_to_parquet(cfg, args.model)
    warn(notes, "recommend")
    print(f"recommend: {rows:,} rows -> {out}")


def _schema(args: argparse.Namespace) -> int:
    """`hugerec schema FILE`: the guessed [preprocess] section, printed or written to --out."""
    try:
        from hugerec.data.input_spec import schema_toml

        separator = args.separator.encode().decode("unicode_escape") if args.separator else None  # "\\t" -> tab
        text = schema_toml(args.file, separator=separator, header=args.header, encoding=args.encoding)
        if args.out is None:
            print(text, end="")
        else:
            args.out.write_text(text)
            print(f"schema: {len(text.splitlines())} lines -> {args.out} (check the types and roles, then preprocess)")
        return 0
    except (ValueError, FileNotFoundError, OSError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        print(f"hugerec schema: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


# `hugerec serve` flags that only some bundle kinds read -> what reads them (any_bundle.server_settings_read)
_SERVE_FLAGS = {
    "--state-dir": ("state_dir", "options"),
    "--redis-url": ("redis_url", "options"),
    "--updates-dir": ("updates_dir", "options"),
    "--updates-stream": ("updates_stream", "options"),
    "--max-delay-ms": ("max_delay_ms", "batching"),
}
_READ_BY = {"options": "model bundles and pipeline bundles with a ranker", "batching": "model and gbm bundles"}


def _check_serve_flags(args: argparse.Namespace) -> None:
    """A flag that no bundle given reads is refused in one line naming it and the bundles' kinds (as serving.load
    refuses an option of another kind), instead of being ignored."""
    from hugerec.serving.bundles.any_bundle import server_settings_read

    read = [(b, *server_settings_read(b)) for b in args.bundles]
    for flag, (dest, setting) in _SERVE_FLAGS.items():
        if getattr(args, dest) is not None and not any(setting in reads for _, _, reads in read):
            kinds = "; ".join(f"{b} is a {kind} bundle" + (" without a ranker" if kind == "pipeline" else "") for b, kind, _ in read)
            raise ValueError(f"{flag} applies to {_READ_BY[setting]} only; {kinds}")


def _serve(args: argparse.Namespace) -> int:
    """`hugerec serve` takes bundle paths, not a training config."""
    try:
        from hugerec.serving.bundles.bundle_loader import ServeOptions
        from hugerec.serving.http.server import ServerConfig, serve
        from hugerec.serving.runtime.batching import BatchingConfig

        for b in args.bundles:
            if not (b / "manifest.json").is_file():
                raise FileNotFoundError(f"{b} is not a bundle (no manifest.json); make one with `hugerec export`")
        _check_serve_flags(args)
        batching = BatchingConfig() if args.max_delay_ms is None else BatchingConfig(max_delay_ms=args.max_delay_ms)
        from hugerec.serving.http.limits import limits_from_overrides

        deadline = {} if args.load_deadline is None else {"load_deadline_s": args.load_deadline}
        config = ServerConfig(
            host=args.host,
            port=args.port,
            admin_token=args.admin_token,
            ingest_token=args.ingest_token,
            batching=batching,
            limits=limits_from_overrides(args.limit),
            **deadline,
        )
        options = ServeOptions(
            state_dir=args.state_dir,
            redis_url=args.redis_url,
            updates_dir=args.updates_dir,
            updates_stream=args.updates_stream,
        )
        from hugerec.serving.http.request_log import RequestLogConfig

        request_log = None if args.request_log is None else RequestLogConfig(args.request_log)
        serve(
            args.bundles,
            host=args.host,
            port=args.port,
            options=options,
            config=config,
            threads=args.threads,
            request_log=request_log,
            decision_log=args.decision_log,
        )
        return 0
    except (ValueError, FileNotFoundError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        print(f"hugerec serve: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _loop(args: argparse.Namespace) -> int:
    """`hugerec loop` reads its own config (hugerec.cli.loop_command), not a training run's."""
    try:
        from hugerec.cli.loop_command import run_loop

        config_path, overrides = _split_args(args.args)
        return run_loop(config_path, overrides, args.print_config, args.log)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        print(f"hugerec loop: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hugerec loop: interrupted (run the same command again to continue)", file=sys.stderr)
        return 130


def _quickstart(cfg: RunConfig, args: argparse.Namespace) -> None:
    from hugerec.cli.commands import preprocess, synth, train

    t0 = time.perf_counter()
    print(f"[1/3] generating {cfg.synth.rows:,} rows of {cfg.synth.preset!r} synthetic clicks ...", flush=True)
    report = synth(cfg)
    print(f"[2/3] preprocessing -> {cfg.preprocess.out} ...", flush=True)
    pre = preprocess(cfg)
    model_name = cfg.model_type
    print(f"[3/3] training {model_name} on {pre.train_rows:,} rows, evaluating on {pre.eval_rows:,} ...", flush=True)
    if _is_gbm(cfg):  # gradient-boosted trees: their own run (model.txt / model.json, no model.pt)
        from hugerec.cli.gbm_commands import train_trees

        trees = train_trees(cfg)
        last, plot = trees.final_eval, trees.plot
    else:
        history = train(cfg)
        last, plot = history.final_eval, history.plot
    assert last is not None  # the quickstart always has eval data
    oracle = next(iter(report.oracle_auc.values()))
    captured = (last["auc"] - 0.5) / (oracle - 0.5) if oracle > 0.5 else math.nan
    print()
    print(f"eval AUC     {last['auc']:.4f}   (oracle AUC {oracle:.4f}: the best any model can do on these labels)")
    print(f"             {captured:.1%} of the oracle's lift over a coin flip (AUC 0.5)")
    print(f"logloss      {last['logloss']:.4f}   calibration {last['calibration']:.3f} (predicted / observed CTR)")
    if _is_gbm(cfg):
        from hugerec.cli.gbm_commands import default_tree_model

        print(f"model        {default_tree_model(cfg)}")
    else:
        print(f"model        {cfg.out_dir / 'model.pt'}")
    print(f"metrics log  {cfg.out_dir / 'metrics.jsonl'}   (TensorBoard: tensorboard --logdir {cfg.out_dir})")
    print(f"plot         {plot}")
    print(f"done in {time.perf_counter() - t0:.0f} s")


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


RUNNERS: dict[str, Callable[[RunConfig, argparse.Namespace], None]] = {
    "quickstart": _quickstart,
    "synth": _synth,
    "preprocess": _preprocess,
    "train": _train,
    "evaluate": _evaluate,
    "predict": _predict,
    "export": _export,
    "index": _index,
    "recommend": _recommend,
}
