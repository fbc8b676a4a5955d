"""A whole run of a task: `run_job(task, config, out)` takes the run folder (`open_run`: the
torchrun group, `prepare_out`, the run lock, `clear_out`), sets the task up (`Task.setup`),
writes the record of the run (`config.json`), trains it (`fit`) and lets it finish (the
classifier's test split, `test.json`). `vitkit train` runs `ClassificationTask`, `vitkit
pretrain` `MaeTask`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .distributed import world
from .fit import FitResult, Progress, fit
from .logs import check_loggers
from .run_folder import open_run, run_files, write_record
from .tasks import ClassificationTask, Task

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """How a run ended: its `fit` result and, when it finished, the test metrics (a
    classification run); `rank` is this process's (only rank 0 reports)."""

    result: FitResult
    test: dict[str, Any] | None
    out: Path
    rank: int = 0
    task: str = "classification"

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary of the run (what `vitkit train --json` prints): the job, the
        folder, the epochs done, the best epoch by the task's metric, the last epoch's row,
        the test metrics and the files the folder holds."""
        result = self.result
        test = None
        if self.test is not None:
            keys = ("loss", "acc1", "acc5", "map", "f1", "count")
            test = {k: self.test[k] for k in keys if k in self.test}
        return {
            "task": self.task,
            "out": str(self.out),
            "interrupted": result.interrupted,
            "epochs": len(result.history),
            "best": {
                "metric": result.best_metric,
                "value": result.best,
                "epoch": result.best_epoch,
            },
            "last": result.history[-1] if result.history else None,
            "test": test,
            "skipped_images": result.corrupt_images,
            "files": run_files(self.out),
        }


def run_job(
    task: type[Task],
    config: Any,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunOutcome:
    """A whole run of `task` (a `Task` class); `RunOutcome.summary()` is its machine-readable
    summary. The epoch rows go to metrics.jsonl, metrics.csv and the config's `loggers`
    (TensorBoard).

    Args:
        task: the job, e.g. `ClassificationTask` or `MaeTask`.
        config: the resolved config (`recipes.resolve_config`); on `resume` the run's saved
            one (`run_folder.read_run_config`) with the options to change, which must be
            those a resume may change (`run_folder.resumed_config`).
        out: the run folder.
        resume: continue the run in `out`.
        overwrite: replace the run in `out` (its files only).
        progress: a progress-bar factory for `fit`.
    """
    check_loggers(config.loggers)  # a missing package is said before anything runs
    with open_run(
        config, out, resume=resume, overwrite=overwrite, task=task.name, files=task.run_files
    ) as config:
        rank, world_size = world()
        if config.threads:
            torch.set_num_threads(config.threads)
        job = task.setup(config)
        if rank == 0:  # on --resume too: the settings it took (more epochs) are the run's now
            write_record(out, config, job.recorded_model(), job.meta, world_size, task=job.name)
        job.log_start(out)
        result = fit(
            job,
            job.train_set,
            job.val_set,
            config,
            out_dir=out,
            resume=resume,
            progress=progress,
            loggers=config.loggers,
        )
        if result.corrupt_images:
            log.warning("skipped %d unreadable training image(s)", result.corrupt_images)
        test = None if result.interrupted else job.finish(out, result)
        return RunOutcome(result=result, test=test, out=out, rank=rank, task=job.name)


def run_training(
    config: Any,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunOutcome:
    """`vitkit train`: `run_job(ClassificationTask, config, out, ...)`."""
    return run_job(
        ClassificationTask, config, out, resume=resume, overwrite=overwrite, progress=progress
    )
