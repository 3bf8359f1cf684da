"""Training: `fit`, `evaluate`, `predict`, metrics, checkpoints, the model file and the learning-rate schedule."""

from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hugerec.training.defaults import auto_batch_size
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.losses import BPR, Negatives, NegativeSampler, SampledSoftmax, bpr, sampled_softmax
from hugerec.training.metrics import BinaryMetrics, auc, calibration, logloss, ndcg_at_k, recall_at_k
from hugerec.training.model_file import SavedModel, load_model, save_model
from hugerec.training.precision import Precision
from hugerec.training.ranking_metrics import evaluate_ranking, list_metrics
from hugerec.training.retrieval import (
    Recommendations,
    RetrievalTrainConfig,
    all_item_vectors,
    evaluate_retrieval,
    fit_retrieval,
    recommend,
)
from hugerec.training.schedule import Schedule
from hugerec.training.trainer import (
    DenseOptimizer,
    History,
    TrainConfig,
    evaluate,
    fit,
    predict,
    resolve_device,
    seed_everything,
)

__all__ = [
    "BPR",
    "BinaryMetrics",
    "DenseOptimizer",
    "EarlyStopping",
    "History",
    "NegativeSampler",
    "Negatives",
    "Precision",
    "Recommendations",
    "RetrievalTrainConfig",
    "SampledSoftmax",
    "SavedModel",
    "Schedule",
    "TrainConfig",
    "all_item_vectors",
    "auc",
    "auto_batch_size",
    "bpr",
    "calibration",
    "evaluate",
    "evaluate_ranking",
    "evaluate_retrieval",
    "fit",
    "fit_retrieval",
    "latest_checkpoint",
    "list_metrics",
    "load_checkpoint",
    "load_model",
    "logloss",
    "ndcg_at_k",
    "predict",
    "recall_at_k",
    "recommend",
    "resolve_device",
    "sampled_softmax",
    "save_checkpoint",
    "save_model",
    "seed_everything",
]
