"""Training: `fit` (one trainer; the families RankingFamily, RetrievalFamily, SequentialFamily), `evaluate`, `predict`, metrics, checkpoints, the model file and the learning-rate schedule."""

from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.gbm_fit import fit_trees
from hugerec.training.model_file import SavedModel, load_model, save_model
from hugerec.training.retrieval import RetrievalFamily, RetrievalValidation, recommend
from hugerec.training.sequential import NextItemValidation, SequentialFamily
from hugerec.training.trainer import History, RankingFamily, TrainConfig, evaluate, fit, predict

__all__ = [
    "EarlyStopping",
    "EpochBatches",
    "History",
    "NextItemValidation",
    "RankingFamily",
    "RetrievalFamily",
    "RetrievalValidation",
    "SavedModel",
    "SequentialFamily",
    "TrainConfig",
    "evaluate",
    "fit",
    "fit_trees",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "predict",
    "recommend",
    "save_model",
]
