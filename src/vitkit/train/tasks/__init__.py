"""What a run trains: the engine (`fit`) is written once; a task supplies the model to
optimise, the loss of a batch, the validation, what "best" means and the files each epoch
writes (torchtune's recipe interface). `ClassificationTask` is `vitkit train`, `MaeTask`
`vitkit pretrain`."""

from .base import Task
from .classification import ClassificationTask, DistillForward
from .mae import MaeTask

__all__ = ["ClassificationTask", "DistillForward", "MaeTask", "Task"]
