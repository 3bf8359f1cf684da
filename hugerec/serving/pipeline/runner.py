"""PipelineRunner: runs a PipelineSpec's stages for one user, in process, with a `match` per stage.

    pipeline = PipelineRunner(spec, Resources(features=..., interactions=..., index=..., encoder=..., ranker=...))
    rec = pipeline.recommend(Query(user=17, k=20), debug=True)
    rec.items, rec.scores, rec.sources        # [k] item ids best first, their scores, the source of each
    rec.stages["filter"]                      # debug: the candidates after each stage

Per stage, K candidates of the user flow as (items [K] int64, source [K] index into SOURCES-order
names, scores [K] float32). Item feature rows are read once, after retrieval, and subset as
candidates are dropped. Ties are broken by the smaller item id everywhere, so a run is
deterministic (exploration draws from the request's seed or the pipeline's generator).

A stage that raises (a store that is down, a model that fails) becomes StageError naming the stage: the
server answers 503 when the cause is a store it could not reach (ConnectionError, TimeoutError), else 500.
Bad requests raise RequestError (400) before any stage runs.

Event times: when the next-items model of the `sequential` source or of a sequential Score was
trained on timestamps (an HSTU with model.times = true), the pipeline `needs_times`: its interaction store
must keep each event's time (refused when built otherwise, naming the stage and the bundle), a request's
own history comes with one time per item (`Query.history_times`, not earlier than the user's latest stored
event and not decreasing), and the model reads the kept history's times: the sequential source gives them
to `next_items` as the next-items bundle's "items.times" (the last max_len known ids keep their own times),
the Score stage to its query (sequential = "next_item") or to the cached candidate scoring (the ranking
head) with the candidates at the time of the user's latest event.
A pipeline without such a model reads no times (history_times are then not used).

History: the user's history is the stored one followed by the request's. When the spec declares
`max_history`, the models are handed its last max_history items. Otherwise each model is handed the whole
history and reads its own length of it, as it does on its own: the two-tower's user tower its last
max_history known ids, item-to-item its last `last` known ids, the sequential model its last max_len known ids (its
next-items bundle's cut: unknown ids dropped with their times, the seen items left out of its answer), so a
sequential model answers in the pipeline what its next-items bundle answers for the same history. That
history is bounded by the server's limits before any work: the store keeps the last max_interactions items
per user and a request adds at most max_history ids (QueryLimits). `max_history` is then reported as the
longest any model reads (`model_history`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hugerec.index.vector_index import VectorIndex
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.stages import (
    NEXT_ITEM,
    RANKING_HEAD,
    Ann,
    Condition,
    Filter,
    ItemToItem,
    Order,
    PipelineSpec,
    Popular,
    Retrieve,
    Score,
    Sequential,
    Source,
    source_name,
)
from hugerec.serving.runtime.inference_protocol import RequestError
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.next_items_model import NextItemsModel

USER, ITEM = "user", "item"  # the feature tables a pipeline reads
STAGE_NAMES = ("retrieve", "filter", "score", "order")


class Ranker(Protocol):
    """What Score needs of a ranking model: a loaded model version's predict (InferenceModel, or any
    model with the same interface, e.g. a GBM bundle): ModelInputs [B rows] -> logits [B] or [B, T]."""

    num_dense: int
    features: tuple[str, ...]

    def predict(self, inputs: ModelInputs) -> np.ndarray: ...


class StageError(Exception):
    """A stage could not run (answered 503 when it could not reach a store, else 500)."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"pipeline stage {stage!r} failed: {type(error).__name__}: {error}")
        self.stage = stage


@dataclass
class Resources:
    """What the stages read. popular: item ids, most popular first. item_vectors: [I, D], row = the
    encoder's dense item id (ItemToItem maps ids with the encoder)."""

    features: FeatureStore
    interactions: InteractionStore = field(default_factory=InteractionStore)
    index: VectorIndex | None = None
    encoder: UserEncoder | None = None
    item_vectors: np.ndarray | None = None
    popular: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ranker: Ranker | None = None
    sequential: NextItemsModel | None = None


@dataclass(frozen=True)
class Query:
    """One request: user id, k, optional recent history (oldest first, added to the stored one),
    context values (keys the pipeline declares), seed for exploration, and the history's event times
    (int64 seconds, one per history item: required with a history when the pipeline `needs_times`)."""

    user: int
    k: int
    history: tuple[int, ...] = ()
    context: Mapping[str, float] = field(default_factory=dict)
    seed: int | None = None
    history_times: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Candidates:
    items: np.ndarray  # [K] int64
    source: np.ndarray  # [K] int64 index into PipelineRunner.sources
    scores: np.ndarray  # [K] float32

    def take(self, keep: np.ndarray) -> Candidates:
        return Candidates(self.items[keep], self.source[keep], self.scores[keep])

    def __len__(self) -> int:
        return int(self.items.shape[0])


@dataclass(frozen=True)
class Recommendation:
    items: np.ndarray  # [k'] item ids, best first (k' < k only with a note saying why)
    scores: np.ndarray  # [k'] float32
    sources: tuple[str, ...]  # [k'] the retrieval source of each item
    cold_start: bool
    notes: tuple[str, ...]
    seconds: dict[str, float]  # stage -> seconds
    counts: dict[str, tuple[int, int]]  # stage -> (candidates in, candidates out)
    stages: dict[str, dict[str, Any]] | None = None  # debug: each stage's candidates

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "items": self.items.tolist(),
            "scores": [float(s) for s in self.scores],
            "sources": list(self.sources),
            "cold_start": self.cold_start,
            "notes": list(self.notes),
        }
        if self.stages is not None:
            out["stages"] = self.stages
            out["seconds"] = self.seconds
        return out


@dataclass
class _State:
    """One request while it runs."""

    query: Query
    user_row: np.ndarray  # [C_user] float32 (zeros when cold)
    cold: bool
    history: np.ndarray  # [H] recent items, oldest first
    seen: np.ndarray  # items to exclude as already seen
    context: dict[str, float]
    times: np.ndarray | None = None  # [H] the history's event times (int64 seconds) when the pipeline needs them
    candidates: Candidates | None = None
    item_rows: np.ndarray | None = None  # [K, C_item] rows of the current candidates
    item_found: np.ndarray | None = None  # [K] bool
    notes: list[str] = field(default_factory=list)


class PipelineRunner:
    def __init__(self, spec: PipelineSpec, resources: Resources, seed: int | None = None) -> None:
        self.spec, self.res = spec, resources
        retrieve: Retrieve = spec.stage(Retrieve)
        self.sources = tuple(source_name(s) for s in retrieve.sources)
        self.order: Order = spec.stage(Order)
        self.context_keys = spec.defaults
        # the model reads the events' times: the store must keep them and a request's history carries them
        self.needs_times = reads_times(spec, resources.sequential)
        # the recent items the models read: declared (each model is handed that many), or the longest a model reads
        self.max_history = spec.max_history if spec.max_history is not None else model_history(spec, resources)
        self.history_from = "declared" if spec.max_history is not None else "models"
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        for table in (USER, ITEM):
            if table not in resources.features.tables:
                raise ValueError(f"Pipeline: the feature store needs a table {table!r}; it has {sorted(resources.features.tables)}")
        self._check(retrieve)
        score: Score | None = spec.stage(Score)
        if score is not None:
            self._check_score(score)
        for stage in spec.stages:
            for cond in _conditions(stage):
                self._check_reference(cond.item_column if "." not in cond.column else cond.column, f"{type(stage).__name__} condition", item_default=True)
                if isinstance(cond.value, str):
                    self._check_reference(cond.value, f"{type(stage).__name__} condition value", item_default=True)
        if self.order.diversity is not None:
            self._check_reference(self.order.diversity, "Order.diversity", item_default=True)

    # -- checks at construction ------------------------------------------------------------------
    def _check(self, retrieve: Retrieve) -> None:
        r = self.res
        for s in retrieve.sources:
            match s:
                case Ann() | ItemToItem():
                    if r.index is None:
                        raise ValueError(f"Pipeline: source {source_name(s)!r} needs an index")
                    if isinstance(s, Ann) and r.encoder is None:
                        raise ValueError("Pipeline: source 'ann' needs a user encoder")
                    if isinstance(s, ItemToItem) and (r.item_vectors is None or r.encoder is None):
                        raise ValueError("Pipeline: source 'item_to_item' needs the item vectors and the encoder (its ids)")
                case Popular():
                    if not len(r.popular):
                        raise ValueError("Pipeline: source 'popular' needs the popular items")
                case Sequential():
                    if r.sequential is None:
                        raise ValueError("Pipeline: source 'sequential' needs a next-items model")
                    _refuse_untimed(r.sequential, r.interactions, "source 'sequential'")

    def _check_score(self, score: Score) -> None:
        if score.sequential:
            stage = f"Score with sequential = {score.sequential!r}"
            model = self.res.sequential
            if model is None:
                raise ValueError(f"Pipeline: {stage} needs a next-items model; it has none")
            _refuse_untimed(model, self.res.interactions, stage)
            if score.sequential == RANKING_HEAD:
                if not model.scores_candidates:
                    raise ValueError(
                        f"Pipeline: {stage} needs an HSTU next-items model (cached candidate scoring); it has a "
                        f"{model.saved.model_type} (sequential = {NEXT_ITEM!r} ranks with any next-items model)"
                    )
                if not model.ranking_head_trained:  # its scores would be a random linear map of the states
                    raise ValueError(
                        f"Pipeline: {stage} uses next-items bundle {model.name!r}, an HSTU whose ranking head was never "
                        f"trained; train it with model.ranking_weight > 0 (e.g. 0.1) and export it again, or rank with "
                        f"sequential = {NEXT_ITEM!r} (the model's next-item score)"
                    )
            return
        ranker = self.res.ranker
        if ranker is None:
            raise ValueError("Pipeline: the Score stage needs a ranker")
        names = [f for f, _ in score.sparse]
        if set(names) != set(ranker.features) or len(score.dense) != ranker.num_dense:
            raise ValueError(
                f"Pipeline: Score gives sparse features {names} and {len(score.dense)} dense values; the ranker takes "
                f"features {list(ranker.features)} and {ranker.num_dense} dense values"
            )
        for ref in (*score.dense, *(r for _, r in score.sparse)):
            self._check_reference(ref, "Score", item_default=False)

    def _check_reference(self, ref: str, where: str, item_default: bool) -> None:
        scope, _, name = ref.partition(".")
        if not name:
            if not item_default:
                raise ValueError(f"Pipeline: {where} reference {ref!r} must say user., item. or context.")
            scope, name = ITEM, ref
        if scope == "context":
            if name not in self.context_keys:
                raise ValueError(f"Pipeline: {where} reads context key {name!r}; declared keys are {sorted(self.context_keys)}")
        elif name != "id":
            self.res.features.column(scope, name)

    # -- running ---------------------------------------------------------------------------------
    def check_query(self, query: Query) -> None:
        """RequestError (400) naming the field when the query is not one this pipeline answers."""
        if isinstance(query.k, bool) or not isinstance(query.k, int) or not 1 <= query.k <= self.order.max_k:
            raise RequestError(f"field 'k' = {query.k!r} must be an integer in 1..{self.order.max_k}")
        unknown = sorted(set(query.context) - set(self.context_keys))
        if unknown:
            raise RequestError(f"field 'context' has unknown keys {unknown}; this pipeline takes {sorted(self.context_keys)}")
        if query.history_times is not None and len(query.history_times) != len(query.history):
            raise RequestError(f"field 'history.times' has {len(query.history_times)} times for the {len(query.history)} history items (one each)")
        if self.needs_times and query.history and query.history_times is None:
            assert self.res.sequential is not None
            raise RequestError(
                f"field 'history.times' is required with a history: next-items bundle {self.res.sequential.name!r} reads the "
                "events' times (int64 seconds, one per history item)"
            )

    def recommend(self, query: Query, debug: bool = False) -> Recommendation:
        self.check_query(query)
        seconds: dict[str, float] = {}
        counts: dict[str, tuple[int, int]] = {}
        stages: dict[str, dict[str, Any]] | None = {} if debug else None
        t0 = time.perf_counter()
        try:
            state = self._start(query)
        except RequestError:
            raise
        except Exception as e:
            raise StageError("features", e) from e
        seconds["features"] = time.perf_counter() - t0
        for stage in self.spec.stages:
            t = time.perf_counter()
            before = 0 if state.candidates is None else len(state.candidates)
            name = "order"
            try:
                match stage:
                    case Retrieve():
                        name = "retrieve"
                        self._retrieve(stage, state)
                    case Filter():
                        name = "filter"
                        self._filter(stage, state)
                    case Score():
                        name = "score"
                        self._score(stage, state)
                    case Order():
                        self._order(stage, state)
            except RequestError:
                raise
            except Exception as e:
                raise StageError(name, e) from e
            seconds[name] = time.perf_counter() - t
            assert state.candidates is not None
            counts[name] = (before, len(state.candidates))
            if stages is not None:
                stages[name] = self._describe(state.candidates)
        final = state.candidates
        assert final is not None
        if len(final) < query.k:
            trail = ", ".join(f"{n} {c[1]}" for n, c in counts.items())
            state.notes.append(f"only {len(final)} of the k = {query.k} asked remain (candidates after each stage: {trail})")
        return Recommendation(
            final.items,
            final.scores,
            tuple(self.sources[s] for s in final.source.tolist()),
            state.cold,
            tuple(state.notes),
            seconds,
            counts,
            stages,
        )

    def _describe(self, c: Candidates) -> dict[str, Any]:
        return {
            "items": c.items.tolist(),
            "scores": [float(s) for s in c.scores],
            "sources": [self.sources[s] for s in c.source.tolist()],
        }

    def _start(self, query: Query) -> _State:
        r = self.res
        rows, found = r.features.read(USER, np.array([query.user], np.int64))
        cold = not bool(found[0])
        stored, stored_times = r.interactions.history(query.user)
        given = np.asarray(query.history, np.int64)
        seen = np.concatenate([stored, given]) if len(given) else stored
        history = seen if self.spec.max_history is None else seen[-self.spec.max_history :]  # each model cuts its own, or declared
        context = {**self.context_keys, **{k: float(v) for k, v in query.context.items()}}
        state = _State(query, rows[0], cold, history, seen, context)
        if self.needs_times:
            assert stored_times is not None  # the store keeps times: checked when built
            state.times = _history_times(stored_times, query.history_times, query.user)[-len(history) :] if len(history) else _NO_TIMES
        if cold:
            state.notes.append(f"user {query.user} is unknown: cold start (popular items{', item-to-item from the history given' if len(given) else ''})")
        return state

    # -- Retrieve ----------------------------------------------------------------------------------
    def _retrieve(self, stage: Retrieve, state: _State) -> None:
        parts: list[tuple[np.ndarray, np.ndarray]] = []  # (items, scores) per source
        for s in stage.sources:
            parts.append(self._source(s, state))
        items = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts]).astype(np.float32)
        source = np.concatenate([np.full(len(p[0]), i, np.int64) for i, p in enumerate(parts)])
        _, first = np.unique(items, return_index=True)
        keep = np.sort(first)  # each id once, where it first appears: source order, then each source's rank
        state.candidates = Candidates(items[keep], source[keep], scores[keep])
        state.item_rows, state.item_found = self.res.features.read(ITEM, state.candidates.items)

    def _source(self, s: Source, state: _State) -> tuple[np.ndarray, np.ndarray]:
        r = self.res
        none = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        match s:
            case Ann():
                assert r.encoder is not None and r.index is not None
                vec = None if state.cold else r.encoder.encode(state.query.user, state.history)
                if vec is None:
                    return none
                return _query(r.index, vec, s.k)
            case ItemToItem():
                assert r.item_vectors is not None and r.index is not None and r.encoder is not None
                known = r.encoder.dense_items(state.history)
                last = known[known >= 0][-s.last :]  # the last `last` ids the index knows, as the other models read
                if not len(last):
                    return none
                return _query(r.index, r.item_vectors[last].mean(axis=0), s.k)
            case Popular():
                k = (s.cold_k or s.k) if state.cold else s.k
                top = r.popular[:k]
                return top, -np.arange(len(top), dtype=np.float32)  # rank as score: the first is best
            case Sequential():
                assert r.sequential is not None
                if not len(state.history):
                    return none
                k = min(s.k, r.sequential.saved.num_items)
                out = r.sequential.next_items(state.history, np.array([len(state.history)]), k, state.times)
                found = out["items"][0] >= 0
                return out["items"][0][found], out["scores"][0][found]

    # -- Filter ------------------------------------------------------------------------------------
    def _filter(self, stage: Filter, state: _State) -> None:
        c = state.candidates
        assert c is not None and state.item_rows is not None and state.item_found is not None
        keep = np.ones(len(c), bool)
        dropped: dict[str, int] = {}

        def apply(mask: np.ndarray, reason: str) -> None:
            nonlocal keep
            n = int((keep & ~mask).sum())
            if n:
                dropped[reason] = n
            keep &= mask

        if stage.exclude_seen and len(state.seen):
            apply(~np.isin(c.items, state.seen), "seen")
        if stage.allow is not None:
            apply(np.isin(c.items, np.array(stage.allow, np.int64)), "not in allow list")
        if stage.deny:
            apply(~np.isin(c.items, np.array(stage.deny, np.int64)), "deny list")
        if stage.keep:
            apply(state.item_found, "no item features")
            for cond in stage.keep:
                apply(self._holds(cond, state), f"{cond.column} {cond.op} {cond.value}")
        self._narrow(state, keep)
        if dropped and len(state.candidates or ()) < state.query.k:
            state.notes.append("filtered out: " + ", ".join(f"{n} ({reason})" for reason, n in dropped.items()))

    def _holds(self, cond: Condition, state: _State) -> np.ndarray:
        """[K] bool: candidates meeting `cond`."""
        lhs = self._values(cond.column if "." in cond.column else f"item.{cond.column}", state)
        rhs: Any = cond.value
        if isinstance(rhs, str):
            rhs = self._values(rhs if "." in rhs else f"item.{rhs}", state)
        return _compare(lhs, cond.op, rhs)

    def _values(self, ref: str, state: _State) -> np.ndarray:
        """[K] float64 values of a reference for the current candidates (user and context broadcast)."""
        c = state.candidates
        assert c is not None and state.item_rows is not None
        scope, _, name = ref.partition(".")
        k = len(c)
        match scope:
            case "item":
                return c.items.astype(np.float64) if name == "id" else state.item_rows[:, self.res.features.column(ITEM, name)].astype(np.float64)
            case "user":
                v = float(state.query.user) if name == "id" else float(state.user_row[self.res.features.column(USER, name)])
                return np.full(k, v)
            case _:
                return np.full(k, state.context[name])

    def _narrow(self, state: _State, keep: np.ndarray) -> None:
        assert state.candidates is not None and state.item_rows is not None and state.item_found is not None
        state.candidates = state.candidates.take(keep)
        state.item_rows, state.item_found = state.item_rows[keep], state.item_found[keep]

    # -- Score -------------------------------------------------------------------------------------
    def _score(self, stage: Score, state: _State) -> None:
        c = state.candidates
        assert c is not None
        k = len(c)
        if k == 0:
            return
        if stage.sequential:
            model = self.res.sequential
            assert model is not None
            if stage.sequential == NEXT_ITEM:
                logits, truncated = model.next_item_scores(state.history, c.items, times=state.times)
                scores = _softmax(logits)  # the model's next-item distribution over the candidates
                room = model.saved.max_len
            else:
                logits, truncated = model.candidate_scores(state.history, c.items, times=state.times)
                scores = 1.0 / (1.0 + np.exp(-np.clip(logits.astype(np.float64), -88.0, 88.0)))
                room = model.saved.max_len - 1
            if truncated:
                state.notes.append(f"score: the history's {truncated} oldest items were left out (the model reads {room})")
            state.candidates = Candidates(c.items, c.source, scores.astype(np.float32))
            return
        assert self.res.ranker is not None
        dense = np.empty((k, len(stage.dense)), np.float32)
        for j, ref in enumerate(stage.dense):
            dense[:, j] = self._values(ref, state)
        one_id = np.empty((len(stage.sparse), k), np.int64)  # [F, K]
        for f, (_, ref) in enumerate(stage.sparse):
            one_id[f] = self._values(ref, state)
        logits = self.res.ranker.predict(ModelInputs.from_one_id(dense, [f for f, _ in stage.sparse], one_id))
        if logits.ndim == 2:
            logits = logits[:, 0]
        scores = 1.0 / (1.0 + np.exp(-np.clip(logits.astype(np.float64), -88.0, 88.0)))
        state.candidates = Candidates(c.items, c.source, scores.astype(np.float32))

    # -- Order -------------------------------------------------------------------------------------
    def _order(self, stage: Order, state: _State) -> None:
        c = state.candidates
        assert c is not None
        k = state.query.k
        scores = c.scores.astype(np.float64)
        for boost in stage.boosts:
            hit = self._holds(boost.when, state)
            scores = np.where(hit, scores * boost.multiply + boost.add, scores)
        key = scores
        if stage.temperature is not None:
            rng = np.random.default_rng(state.query.seed) if state.query.seed is not None else None
            if rng is None:
                with self._rng_lock:
                    gumbel = self._rng.gumbel(size=len(c))
            else:
                gumbel = rng.gumbel(size=len(c))
            key = scores / stage.temperature + gumbel  # Gumbel top-k: sampling without replacement from softmax(score / T)
        order = np.lexsort((c.items, -key))  # best first, ties: smaller id first
        if stage.diversity is not None and stage.per_category is not None:
            cats = self._values(stage.diversity if "." in stage.diversity else f"item.{stage.diversity}", state)[order]
            order = order[_occurrence(cats) < stage.per_category]
        top = order[:k]
        state.candidates = Candidates(c.items[top], c.source[top], scores[top].astype(np.float32))
        if state.item_rows is not None and state.item_found is not None:
            state.item_rows, state.item_found = state.item_rows[top], state.item_found[top]


def _conditions(stage: object) -> list[Condition]:
    match stage:
        case Filter():
            return list(stage.keep)
        case Order():
            return [b.when for b in stage.boosts]
        case _:
            return []


def _query(index: VectorIndex, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores, ids = index.query(vec[None, :].astype(np.float32), min(k, len(index)))
    ids_np, scores_np = ids[0].numpy(), scores[0].numpy()
    found = ids_np >= 0
    return ids_np[found], scores_np[found]


def _compare(lhs: np.ndarray, op: str, rhs: Any) -> np.ndarray:
    match op:
        case "==":
            return np.asarray(lhs == rhs)
        case "!=":
            return np.asarray(lhs != rhs)
        case "<":
            return np.asarray(lhs < rhs)
        case "<=":
            return np.asarray(lhs <= rhs)
        case ">":
            return np.asarray(lhs > rhs)
        case ">=":
            return np.asarray(lhs >= rhs)
        case "in":
            return np.isin(lhs, np.asarray(rhs, np.float64))
        case _:
            return ~np.isin(lhs, np.asarray(rhs, np.float64))


def _occurrence(values: np.ndarray) -> np.ndarray:
    """[K] -> [K]: how many earlier positions hold the same value (0 for the first of each)."""
    if not len(values):
        return np.zeros(0, np.int64)
    _, inverse = np.unique(values, return_inverse=True)
    order = np.argsort(inverse, kind="stable")  # grouped by value, positions ascending in each group
    grouped = inverse[order]
    starts = np.r_[0, np.flatnonzero(np.diff(grouped)) + 1]
    rank = np.arange(len(values)) - np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    out = np.empty(len(values), np.int64)
    out[order] = rank
    return out


def model_history(spec: PipelineSpec, resources: Resources) -> int:
    """The longest recent history any model of the pipeline reads: the two-tower user tower's max_history,
    item-to-item's `last`, the sequential model's max_len (source or Score); 0 when none reads one (a matrix
    factorisation, popular items)."""
    retrieve: Retrieve = spec.stage(Retrieve)
    score: Score | None = spec.stage(Score)
    reads = [0]
    for s in retrieve.sources:
        match s:
            case Ann():
                reads.append(resources.encoder.history_read if resources.encoder is not None else 0)
            case ItemToItem():
                reads.append(s.last)
            case Sequential():
                if resources.sequential is not None:
                    reads.append(resources.sequential.saved.max_len)
            case Popular():
                pass
    if score is not None and score.sequential and resources.sequential is not None:
        reads.append(resources.sequential.saved.max_len)
    return max(reads)


def reads_times(spec: PipelineSpec, model: NextItemsModel | None) -> bool:
    """Whether the pipeline's next-items model reads event times: it was trained on them (an HSTU with
    model.times = true) and the spec uses it (the `sequential` source, or a sequential Score)."""
    retrieve: Retrieve = spec.stage(Retrieve)
    score: Score | None = spec.stage(Score)
    used = any(isinstance(s, Sequential) for s in retrieve.sources) or (score is not None and bool(score.sequential))
    return used and model is not None and model.uses_times


_NO_TIMES = np.zeros(0, np.int64)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """[K] logits (-inf: a candidate the model does not know) -> [K] float64 probabilities summing to 1 over
    the known ones (all 0 when none is known)."""
    x = logits.astype(np.float64)
    finite = np.isfinite(x)
    out = np.zeros(len(x))
    if finite.any():
        e = np.exp(x[finite] - x[finite].max())
        out[finite] = e / e.sum()
    return out


def _history_times(stored: np.ndarray, given: tuple[int, ...] | None, user: int) -> np.ndarray:
    """The stored history's times followed by the request's history times ([S + G] int64 seconds); RequestError
    naming 'history.times' when those go back in time (before the user's latest stored event, or decreasing)."""
    if not given:
        return stored
    new = np.asarray(given, np.int64)
    if len(new) > 1 and (np.diff(new) < 0).any():
        j = int(np.argmax(np.diff(new) < 0)) + 1
        raise RequestError(f"field 'history.times[{j}]' = {int(new[j])} is earlier than history.times[{j - 1}] = {int(new[j - 1])}: the history goes oldest first")
    if len(stored) and int(new[0]) < int(stored[-1]):
        raise RequestError(f"field 'history.times[0]' = {int(new[0])} is earlier than user {user}'s latest stored event time {int(stored[-1])}")
    return np.concatenate([stored, new])


def _refuse_untimed(model: NextItemsModel, interactions: InteractionStore, stage: str) -> None:
    """A next-items model trained on timestamps (an HSTU with model.times = true) reads each event's time: a
    pipeline whose interaction store keeps none is refused when built."""
    if model.uses_times and not interactions.timed:
        raise ValueError(
            f"Pipeline: {stage} uses next-items bundle {model.name!r}, an HSTU trained with model.times = true, but the "
            "interaction store keeps no event times (build it from events with their timestamps, or use a bundle trained with times = false)"
        )
