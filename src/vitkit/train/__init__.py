"""The training jobs: `TrainConfig` and `PretrainConfig`, recipe presets, the engine (`fit`
and its loop) and its tasks, each of which sets itself up (`Task.setup`), and `run_job`, a
whole run of a task.

Imports flow one way: `cli` -> `train` -> `weights`, `explain` -> `model`, `data`.
"""

from .config import PretrainConfig, TrainConfig
from .distributed import ShardSampler, make_loader
from .fit import FitResult, fit
from .job import RunOutcome, run_job, run_training
from .loop import NonFiniteLossError, evaluate, train_one_epoch
from .losses import distill_loss, soft_cross_entropy
from .multi_label import average_precision, evaluate_multi_label
from .optim import ModelEma, Schedule, lr_at, param_groups
from .recipes import RECIPES, resolve_config
from .run_folder import BEST_FILE, EMA_FILE, LAST_FILE, METRICS_FILE, STATE_FILE
from .signals import StopFlag
from .state import EpochState, RunState, load_state, save_state
from .tasks import ClassificationTask, MaeTask, Task
from .tasks.classification import TrainingSetup, training_setup

__all__ = [
    "BEST_FILE",
    "EMA_FILE",
    "LAST_FILE",
    "METRICS_FILE",
    "RECIPES",
    "STATE_FILE",
    "ClassificationTask",
    "EpochState",
    "FitResult",
    "MaeTask",
    "ModelEma",
    "NonFiniteLossError",
    "PretrainConfig",
    "RunOutcome",
    "RunState",
    "Schedule",
    "ShardSampler",
    "StopFlag",
    "Task",
    "TrainConfig",
    "TrainingSetup",
    "average_precision",
    "distill_loss",
    "evaluate",
    "evaluate_multi_label",
    "fit",
    "load_state",
    "lr_at",
    "make_loader",
    "param_groups",
    "resolve_config",
    "run_job",
    "run_training",
    "save_state",
    "soft_cross_entropy",
    "train_one_epoch",
    "training_setup",
]
