"""The config reference, generated from the config dataclasses: every key with its type, default and meaning.

A config file is a tree of frozen dataclasses (`RunConfig` for train / evaluate / ..., `LoopFile` for
`hugerec loop`, the stage dataclasses for `hugerec pipeline build`). `walk` visits it and yields one
`Key` per field; nested dataclasses become their own TOML tables, lists of dataclasses their own
arrays of tables, and a union of dataclasses (the sparse optimizers, the model types) one table per
variant, named by its `type`.

A field's meaning is read from the code, first match wins:
  1. a comment on the field's line, or on the comment lines right above it;
  2. the class docstring's block form, a field name (or several, comma-separated) at the start of a
     line, two or more spaces, then the meaning, continued on more-indented lines;
  3. the class docstring's inline form, `name: meaning` after the docstring's start, a `;` or a
     sentence's end.
A field with none is `Key.meaning = None`; tests/test_docs_reference.py fails on it, so the
reference stays complete as the code changes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    """One config key: its dotted path (`train.early_stopping.patience`), the TOML table it is written in."""

    table: str  # "[train.early_stopping]", "[[preprocess.join]]", "[model] type = \"dlrm\""
    name: str
    type: str
    default: str
    meaning: str | None
    owner: str  # module.Class that declares the field (where a missing meaning must be written)


@dataclass(frozen=True)
class Variants:
    """A field whose value is one of several dataclasses, told apart by a `type` key."""

    key: str  # the key that names the variant, "type"
    choices: tuple[tuple[str, type], ...]  # (name, dataclass)
    default: str | None  # the variant taken when the key is absent
    is_list: bool = False  # a list of such tables (the pipeline's retrieve.sources), not one table


# -- meanings ----------------------------------------------------------------------------------------
NAMES = r"[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*"
BLOCK = re.compile(rf"^(?P<indent>\s*)(?P<names>{NAMES})(?:\s{{2,}}|\s*:\s+)(?P<text>\S.*)$")
INLINE = re.compile(rf"^`?(?P<names>{NAMES})`?\s*:\s+(?P<text>\S.*)$", re.S)


@functools.cache
def field_meanings(cls: type) -> dict[str, str]:
    """Field name -> meaning for the fields of `cls` the code documents (see the module docstring)."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    for klass in cls.__mro__:  # a subclass's own meanings first, then those of the config it extends
        if not dataclasses.is_dataclass(klass):
            continue
        for source in (_comment_meanings(klass, names), _block_meanings(klass, names), _inline_meanings(klass, names)):
            for k, v in source.items():
                out.setdefault(k, v)
    return out


def _comment_meanings(cls: type, names: set[str]) -> dict[str, str]:
    """`name: type = default  # meaning`, or `# meaning` lines right above the field."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    field_line = re.compile(r"^    (?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*:")
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    for i, line in enumerate(lines, start=1):
        m = field_line.match(line)
        if m is None or m.group("name") not in names:
            continue
        text = comments.get(i)
        if text is None:  # comment lines directly above
            above = []
            j = i - 1
            while j >= 1 and lines[j - 1].strip().startswith("#"):
                above.append(comments.get(j, ""))
                j -= 1
            text = " ".join(reversed(above)) or None
        if text:
            out[m.group("name")] = text
    return out


def _docstring_lines(cls: type) -> list[str]:
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature is not a docstring
        return []
    return inspect.cleandoc(doc).splitlines()


def _split_names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",")]


def _block_meanings(cls: type, names: set[str]) -> dict[str, str]:
    """A `name   meaning` block: names at a line start, two spaces, the meaning, continuation lines indented more."""
    lines = _docstring_lines(cls)
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = BLOCK.match(lines[i])
        found = _split_names(m.group("names")) if m else []
        if m is None or not found or not all(n in names for n in found) or ":" in lines[i][: m.start("text")]:
            i += 1
            continue
        indent = len(m.group("indent"))
        text = [m.group("text").strip()]
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > indent:
            text.append(lines[i].strip())
            i += 1
        for n in found:
            out.setdefault(n, " ".join(text))
    return out


def _inline_meanings(cls: type, names: set[str]) -> dict[str, str]:
    """`name: meaning; other: meaning.` in the docstring's running text."""
    text = " ".join(line.strip() for line in _docstring_lines(cls))
    out: dict[str, str] = {}
    for segment in re.split(r";\s+|(?<=[a-z)\]])\.\s+", text):
        m = INLINE.match(segment.strip())
        if m is None:
            continue
        found = _split_names(m.group("names"))
        if all(n in names for n in found):
            for n in found:
                out.setdefault(n, m.group("text").strip().rstrip("."))
    return out


# -- types and defaults ------------------------------------------------------------------------------
def type_text(tp: Any) -> str:
    """A field type as a config author reads it: `int or none`, `list of int`, `"fp32" | "bf16"`, `table`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        parts = [type_text(a) for a in args if a is not type(None)]
        text = " or ".join(dict.fromkeys(parts))
        return f"{text} or none" if type(None) in args else text
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item = type_text(args[0]) if args else "value"
        return f"list of {item}"
    if origin is dict or tp is dict:
        return "table"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "table"
    if isinstance(tp, type):
        return {"str": "string", "int": "int", "float": "float", "bool": "bool"}.get(tp.__name__, tp.__name__)
    return str(tp)


def value_text(value: Any) -> str:
    """A default as TOML would spell it (`none` for None)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value_text(value.value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {value_text(v)}" for k, v in value.items()) + "}" if value else "{}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "(table below)"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def default_of(f: dataclasses.Field[Any]) -> tuple[bool, Any]:
    """(has a default, the default) of a dataclass field."""
    if f.default is not dataclasses.MISSING:
        return True, f.default
    if f.default_factory is not dataclasses.MISSING:
        return True, f.default_factory()
    return False, None


def _summary(cls: type) -> str | None:
    """The first sentence of a class's docstring (a nested section's meaning when its field has none)."""
    lines = _docstring_lines(cls)
    if not lines or (BLOCK.match(lines[0]) and lines[0].split()[0] in {f.name for f in dataclasses.fields(cls)}):
        return None
    first = " ".join(lines[: lines.index("") if "" in lines else len(lines)])
    return re.split(r"(?<=[a-z)])\.\s", first)[0].rstrip(".")


# -- the walk ----------------------------------------------------------------------------------------
def _dataclass_args(tp: Any) -> list[type]:
    """The dataclasses `tp` is (a dataclass, `X | None`, or a union of them)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return [tp] if isinstance(tp, type) and dataclasses.is_dataclass(tp) else []


def _list_item(tp: Any) -> type | None:
    """The dataclass of `tuple[X, ...]` / `list[X]`, else None."""
    if typing.get_origin(tp) in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def walk(cls: type, table: str, variants: dict[str, Variants], tables_seen: list[str] | None = None) -> Iterator[Key]:
    """Every key of dataclass `cls` written in TOML table `table` ("train", "preprocess.join[]"), depth first.

    `variants` maps a dotted key path ("embedding.optimizer", "model") to the dataclasses it may hold.
    """
    hints = typing.get_type_hints(cls)
    meanings = field_meanings(cls)
    owner = f"{cls.__module__}.{cls.__qualname__}"
    nested: list[tuple[str, type | Variants, bool]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal", False):  # the loader's bookkeeping (cli.config_file.INTERNAL), not a key
            continue
        tp = hints[f.name]
        path = f"{table}.{f.name}" if table else f.name
        has_default, default = default_of(f)
        meaning = meanings.get(f.name)
        if path in variants:
            v = variants[path]
            kind = "list of tables" if v.is_list else "table"
            dflt = f'{v.key} = "{v.default}"' if v.default else value_text(default) if has_default else "required"
            yield Key(table, f.name, kind, dflt, meaning or f"one of the tables below, chosen by `{v.key}`", owner)
            nested.append((path, v, v.is_list))
            continue
        item = _list_item(tp)
        if item is not None:
            meaning = meaning or _summary(item)
            yield Key(table, f.name, "list of tables", value_text(default) if has_default else "required", meaning, owner)
            nested.append((path, item, True))
            continue
        classes = _dataclass_args(tp)
        if len(classes) == 1:
            text = type_text(tp)
            dflt = "(table below)" if has_default and default is not None else value_text(default) if has_default else "required"
            yield Key(table, f.name, text, dflt, meaning or _summary(classes[0]), owner)
            nested.append((path, classes[0], False))
            continue
        yield Key(table, f.name, type_text(tp), value_text(default) if has_default else "required", meaning, owner)
    for path, sub, is_list in nested:
        if isinstance(sub, Variants):
            for name, vcls in sub.choices:
                label = f'{path}{"[]" if is_list else ""} ({sub.key} = "{name}")'
                what = _summary(vcls) or f"the {name} variant"
                yield Key(label, sub.key, f'"{name}"', "" if name != sub.default else f'"{name}"', what, owner)
                yield from walk(vcls, label, variants)
        else:
            yield from walk(sub, f"{path}[]" if is_list else path, variants)


# -- the three config files ------------------------------------------------------------------------
def optimizer_variants() -> Variants:
    from hugerec.embedding.optimizers import Optimizer, optimizer_to_dict

    choices = tuple((optimizer_to_dict(c())["type"], c) for c in typing.get_args(Optimizer))
    return Variants("type", choices, None)


def model_variants() -> Variants:
    """Every `[model] type` of the registry and the config class that reads its other keys."""
    from hugerec.models import REGISTRY

    return Variants("type", tuple((name, t.config) for name, t in REGISTRY.items()), "dlrm")


def loop_model_variants() -> Variants:
    """The loop's [model]: the registry's dialect, of the one type the loop trains."""
    from hugerec.models import REGISTRY

    return Variants("type", (("dlrm", REGISTRY["dlrm"].config),), "dlrm")


@dataclass(frozen=True)
class ConfigFile:
    """One kind of config file: its title, the commands that read it, its root dataclass, its variants."""

    title: str
    anchor: str
    commands: str
    root: type
    variants: Callable[[], dict[str, Variants]]
    intro: str


def _run_variants() -> dict[str, Variants]:
    opt = optimizer_variants()
    return {
        "model": model_variants(),
        "embedding.optimizer": opt,
        "model.wide_optimizer": opt,
        **{f'model (type = "{n}").wide_optimizer': opt for n in ("deepfm", "wide_and_deep")},
    }


def _loop_variants() -> dict[str, Variants]:
    return {"model": loop_model_variants(), "embedding.optimizer": optimizer_variants()}


def _retrieval_loop_variants() -> dict[str, Variants]:
    from hugerec.models import REGISTRY

    models = Variants("type", tuple((n, REGISTRY[n].config) for n in ("two_tower", "mf")), "two_tower")
    return {"model": models, "embedding.optimizer": optimizer_variants()}


@dataclass(frozen=True)
class PipelineInputs:
    """[inputs]: the trained models and tables a pipeline bundle is built from (paths are found like a run
    config's inputs: in the current directory, then next to the config file)."""

    retrieval_model: str  # `hugerec train` of a two_tower / mf model (its model.pt): the ann and item_to_item sources
    out: str  # the bundle folder (`--out` overrides it)
    ranker_bundle: str | None = None  # `hugerec export` of a ranking model; needed by [score]
    sequential_bundle: str | None = None  # a next-items bundle (`hugerec export` of a sequential model): the sequential source
    user_features: str | None = None  # CSV or Parquet: column "user" + numeric columns (user.<column> in conditions and [score])
    item_features: str | None = None  # CSV or Parquet: column "item" + numeric columns (conditions, diversity, [score])
    index: str = "hnsw"  # the item index: "hnsw" (approximate, usearch) or "exact"
    index_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # HNSW's connectivity, expansion_add, expansion_search, dtype ("f32" | "f16"), max_norm


@dataclass(frozen=True)
class PipelineHead:
    """[pipeline]: the name the pipeline is served under and what a request may send."""

    name: str = "pipeline"  # the served name: KServe v2 model /v2/models/NAME (POST /recommend serves it too)
    version: str = "1"  # its version, as the admin API's load / canary / promote name it
    context: dict[str, float] = dataclasses.field(default_factory=dict)  # keys a request may send in "context", each with its default number
    max_history: int | None = None  # the user's most recent items handed to the models (stored, then the request's); left out: the longest history a model of the pipeline reads (two-tower max_history, item_to_item last, the sequential model's max_len), within the server's max_history limit


def _pipeline_variants() -> dict[str, Variants]:
    from hugerec.serving.pipeline import Ann, ItemToItem, Popular, Sequential

    sources = (("ann", Ann), ("item_to_item", ItemToItem), ("popular", Popular), ("sequential", Sequential))
    return {"retrieve.sources": Variants("kind", sources, None, is_list=True)}


def _pipeline_root() -> type:
    """The pipeline config's sections as one dataclass: [inputs], [pipeline] and the stage dataclasses."""
    from hugerec.serving.pipeline import Filter, Order, Retrieve, Score

    return dataclasses.make_dataclass(
        "PipelineFile",
        [
            ("inputs", PipelineInputs),
            ("retrieve", Retrieve),
            ("pipeline", PipelineHead, dataclasses.field(default_factory=PipelineHead)),
            ("filter", Filter | None, dataclasses.field(default=None)),
            ("score", Score | None, dataclasses.field(default=None)),
            ("order", Order, dataclasses.field(default_factory=Order)),
        ],
        frozen=True,
    )


def _up_root() -> type:
    """up.toml as a dataclass: its one [ranker] table."""
    from hugerec.cli.up_ranker import RankerSection

    return dataclasses.make_dataclass("UpFile", [("ranker", RankerSection, dataclasses.field(default_factory=RankerSection))], frozen=True)


def config_files() -> list[ConfigFile]:
    from hugerec.cli.loop_command import LoopFile
    from hugerec.cli.retrieval_loop_command import RetrievalLoopFile
    from hugerec.cli.run_config import RunConfig

    return [
        ConfigFile(
            "The run config",
            "run-config",
            "`hugerec quickstart`, `synth`, `preprocess`, `train`, `evaluate`, `predict`, `export`, `index`, `recommend`",
            RunConfig,
            _run_variants,
            "One TOML file per data set and model; every section is optional (left out, it takes its defaults). "
            "Without a file, the commands take the quickstart's settings (`configs/quickstart.toml`).",
        ),
        ConfigFile(
            "The loop config",
            "loop-config",
            "`hugerec loop`",
            LoopFile,
            _loop_variants,
            "The continuous-training loop's file (`configs/loop_synthetic.toml`).",
        ),
        ConfigFile(
            "The retrieval loop config",
            "retrieval-loop-config",
            "`hugerec loop` with `model.type = \"two_tower\"` or `\"mf\"`",
            RetrievalLoopFile,
            _retrieval_loop_variants,
            "The continuous-training loop of a retrieval model (`configs/loop_two_tower.toml`; over your own interaction "
            "log: `configs/loop_movielens.toml`): its own [loop], [data] (a synthetic stream) or [preprocess] + [windows] "
            "(your log, as `hugerec train` declares it, split into windows by its timestamp), [gate], [index] and "
            "[server]; a key of the ranking loop's file is refused.",
        ),
        ConfigFile(
            "The up config",
            "up-config",
            "`hugerec up`",
            _up_root(),
            dict,
            "`up.toml`, written by `hugerec up` beside `retriever.toml`: how it builds the ranking stage "
            "(`ranker.KEY=VALUE` on its command line overrides a key; `--ranker` is `ranker.enabled = true`, `--no-ranker` is `ranker.enabled = false`).",
        ),
        ConfigFile(
            "The pipeline config",
            "pipeline-config",
            "`hugerec pipeline build`",
            _pipeline_root(),
            _pipeline_variants,
            "A recommendation pipeline's stages and the trained models it is built from "
            "(`configs/movielens_pipeline.toml`).",
        ),
    ]


def all_keys() -> list[tuple[ConfigFile, Key]]:
    return [(c, k) for c in config_files() for k in walk(c.root, "", c.variants())]


# -- rendering -----------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    if not text:
        return ""
    return "<code>" + _cell(text) + "</code>"


def _heading(table: str) -> str:
    """A table's TOML header: `[train.early_stopping]`, `[[preprocess.join]]`, `[model] type = "dcn_v2"`,
    `[[model.vectors]] (model.type = "dlrm")`: the variants chosen on the way, the table's own last."""
    qualifiers = []  # (dotted path of the table whose key chooses, key, value)
    path = ""
    rest = table
    for m in re.finditer(r'(?P<path>[^ ()]*) \((?P<key>\w+) = "(?P<value>[^"]+)"\)', table):
        path += m.group("path")
        qualifiers.append((path.replace("[]", "").lstrip("."), m.group("key"), m.group("value")))
        rest = table[m.end() :]
    base = (path + rest).replace(" ", "")
    inner = base.replace("[]", "").lstrip(".")
    head = f"[[{inner}]]" if base.endswith("[]") else f"[{inner}]"
    own = [f'{k} = "{v}"' for p, k, v in qualifiers if p == inner]
    outer = [f'{p}.{k} = "{v}"' for p, k, v in qualifiers if p != inner]
    return " ".join([head, *own, *([f"({', '.join(outer)})"] if outer else [])])


def missing(keys: list[Key]) -> list[Key]:
    """Keys without a meaning (the root's sections need none: each has its own table)."""
    return [k for k in keys if not k.meaning and k.table]


def table_anchor(config: ConfigFile, table: str) -> str:
    """The stable anchor of a TOML table's section: `run-config-train-early_stopping`."""
    return f"{config.anchor}-" + re.sub(r"[^a-z0-9_]+", "-", table.lower()).strip("-")


def render(config: ConfigFile) -> str:
    """The Markdown of one config file's reference: a table of keys per TOML table (sections first, in
    the root's field order); a key holding a table links to it."""
    keys = list(walk(config.root, "", config.variants()))
    out = [f"## {config.title} {{#{config.anchor}}}", "", f"Read by {config.commands}. {config.intro}", ""]
    by_table: dict[str, list[Key]] = {}
    for k in keys:
        by_table.setdefault(k.table, []).append(k)
    for table, rows in by_table.items():
        if not table:
            continue  # the root's fields are the sections themselves, each with its own table below
        anchor = table_anchor(config, table)
        out += [f"### `{_heading(table)}` {{#{anchor}}}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for k in rows:
            sub = f"{table}.{k.name}"
            default = _code(k.default)
            if sub in by_table:
                default = f"[table]({'#' + table_anchor(config, sub)})"
            out.append(f"| `{k.name}` | {_code(k.type)} | {default} | {_cell(k.meaning or '')} |")
        out.append("")
    return "\n".join(out)


def render_all() -> str:
    return "\n".join(render(c) for c in config_files())
