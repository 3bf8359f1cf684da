"""Training: `fit` (one trainer; the families Ranking, Retrieval, Sequential), `evaluate`, `predict`, metrics, checkpoints, the model file and the learning-rate schedule."""

from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hugerec.training.defaults import auto_batch_size
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.gbm import TreeHistory, evaluate_trees, fit_trees, library_version
from hugerec.training.losses import BPR, Negatives, NegativeSampler, RetrievalLoss, SampledSoftmax, bpr, sampled_softmax
from hugerec.training.metrics import BinaryMetrics, auc, calibration, logloss, ndcg_at_k, recall_at_k
from hugerec.training.model_file import SavedModel, load_model, model_file_task, save_model
from hugerec.training.precision import Precision
from hugerec.training.ranking_metrics import evaluate_ranking, list_metrics
from hugerec.training.retrieval import (
    Recommendations,
    Retrieval,
    RetrievalModel,
    RetrievalValidation,
    all_item_vectors,
    evaluate_retrieval,
    rank_part,
    recommend,
    user_vectors,
)
from hugerec.training.retrieval_file import SavedRetrievalModel, load_retrieval_model, save_retrieval_model
from hugerec.training.schedule import Schedule
from hugerec.training.sequence_file import build_sequence_model, load_sequence_model, save_sequence_model
from hugerec.training.sequential import (
    BCE,
    FullSoftmax,
    NextItemValidation,
    SequenceLoss,
    SequenceModel,
    Sequential,
    evaluate_next_item,
    query_vectors,
    window_batches,
    window_width,
)
from hugerec.training.trainer import (
    DenseOptimizer,
    History,
    Ranking,
    TrainConfig,
    evaluate,
    fit,
    predict,
    resolve_device,
    seed_everything,
)

__all__ = [
    "BCE",
    "BPR",
    "BinaryMetrics",
    "DenseOptimizer",
    "EarlyStopping",
    "EpochBatches",
    "FullSoftmax",
    "History",
    "NegativeSampler",
    "Negatives",
    "NextItemValidation",
    "Precision",
    "Ranking",
    "Recommendations",
    "Retrieval",
    "RetrievalLoss",
    "RetrievalModel",
    "RetrievalValidation",
    "SampledSoftmax",
    "SavedModel",
    "SavedRetrievalModel",
    "Schedule",
    "SequenceLoss",
    "SequenceModel",
    "Sequential",
    "TrainConfig",
    "TreeHistory",
    "all_item_vectors",
    "auc",
    "auto_batch_size",
    "bpr",
    "build_sequence_model",
    "calibration",
    "evaluate",
    "evaluate_next_item",
    "evaluate_ranking",
    "evaluate_retrieval",
    "evaluate_trees",
    "fit",
    "fit_trees",
    "latest_checkpoint",
    "library_version",
    "list_metrics",
    "load_checkpoint",
    "load_model",
    "load_retrieval_model",
    "load_sequence_model",
    "logloss",
    "model_file_task",
    "ndcg_at_k",
    "predict",
    "query_vectors",
    "rank_part",
    "recall_at_k",
    "recommend",
    "resolve_device",
    "sampled_softmax",
    "save_checkpoint",
    "save_model",
    "save_retrieval_model",
    "save_sequence_model",
    "seed_everything",
    "user_vectors",
    "window_batches",
    "window_width",
]
