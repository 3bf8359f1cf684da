"""Training: `fit`, `evaluate`, `predict`, metrics, checkpoints, the model file and the learning-rate schedule."""

from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hugerec.training.metrics import BinaryMetrics, auc, calibration, logloss, ndcg_at_k, recall_at_k
from hugerec.training.model_file import SavedModel, load_model, save_model
from hugerec.training.precision import Precision
from hugerec.training.schedule import Schedule
from hugerec.training.trainer import DenseOptimizer, History, TrainConfig, evaluate, fit, predict

__all__ = [
    "BinaryMetrics",
    "DenseOptimizer",
    "History",
    "Precision",
    "SavedModel",
    "Schedule",
    "TrainConfig",
    "auc",
    "calibration",
    "evaluate",
    "fit",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "logloss",
    "ndcg_at_k",
    "predict",
    "recall_at_k",
    "save_checkpoint",
    "save_model",
]
