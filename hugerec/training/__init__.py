"""Training: `fit` (one trainer; the families RankingFamily, RetrievalFamily, SequentialFamily), `evaluate`, `predict`, metrics, checkpoints, the model file and the learning-rate schedule."""

from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hugerec.training.declared_loss import retrieval_loss, sequence_loss
from hugerec.training.defaults import auto_batch_size, auto_width, fitted_to_data
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.gbm_fit import TreeHistory, evaluate_trees, fit_trees, library_version
from hugerec.training.losses import BPR, NegativeSampler, RetrievalLoss, SampledSoftmax, bpr, sampled_softmax
from hugerec.training.metrics import BinaryMetrics, auc, calibration, logloss, ndcg_at_k, recall_at_k
from hugerec.training.model_file import RawIds, SavedModel, load_model, save_model
from hugerec.training.precision import Precision
from hugerec.training.ranking_metrics import evaluate_ranking, list_metrics
from hugerec.training.retrieval import (
    Recommendations,
    RetrievalFamily,
    RetrievalModel,
    RetrievalValidation,
    all_item_vectors,
    evaluate_retrieval,
    rank_part,
    recommend,
    user_vectors,
)
from hugerec.training.schedule import Schedule
from hugerec.training.sequential import (
    BCE,
    FullSoftmax,
    NextItemValidation,
    SequenceLoss,
    SequenceModel,
    SequentialFamily,
    evaluate_next_item,
    query_vectors,
    window_batches,
    window_width,
)
from hugerec.training.trainer import (
    DenseOptimizer,
    History,
    RankingFamily,
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
    "NextItemValidation",
    "Precision",
    "RankingFamily",
    "RawIds",
    "Recommendations",
    "RetrievalFamily",
    "RetrievalLoss",
    "RetrievalModel",
    "RetrievalValidation",
    "SampledSoftmax",
    "SavedModel",
    "Schedule",
    "SequenceLoss",
    "SequenceModel",
    "SequentialFamily",
    "TrainConfig",
    "TreeHistory",
    "all_item_vectors",
    "auc",
    "auto_batch_size",
    "auto_width",
    "bpr",
    "calibration",
    "evaluate",
    "evaluate_next_item",
    "evaluate_ranking",
    "evaluate_retrieval",
    "evaluate_trees",
    "fit",
    "fit_trees",
    "fitted_to_data",
    "latest_checkpoint",
    "library_version",
    "list_metrics",
    "load_checkpoint",
    "load_model",
    "logloss",
    "ndcg_at_k",
    "predict",
    "query_vectors",
    "rank_part",
    "recall_at_k",
    "recommend",
    "resolve_device",
    "retrieval_loss",
    "sampled_softmax",
    "save_checkpoint",
    "save_model",
    "seed_everything",
    "sequence_loss",
    "user_vectors",
    "window_batches",
    "window_width",
]
