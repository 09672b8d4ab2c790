"""The one training loop, for every model, as a package (each module imports its siblings directly):

  loop.py        Trainer: holds the parts below and runs the epochs: logging, evaluations, one step's
                 agreement across ranks, the stops; train()
  rundir.py      RunDirectory: its name, claim and lock, run files and plan.json, pruning, the FSDP out-of-memory marker
  engine.py      Engine: the model, optimizer and scaler; DDP/FSDP/compile; forward/backward over a window; update
  recovery.py    Recovery: the plan and Progress as out-of-memory changes them (halving, the ladder's rungs, the
                 FSDP relaunch), or resuming on another device; every change through lib/planning/ladder.py
  checkpoints.py Checkpoints: save, restore, sharded checkpoints, best-k, the stops that save first
  conditions.py  heat and battery: pause until the GPU cools, checkpoint more often or stop on a low battery
  windows.py     which samples a step sees: the epoch order, windows, per-rank micro-batches; Progress
  resume.py      checkpoint contents, RNG state, RESUME_FROM, stopping on SIGTERM/SIGINT (or by itself: a lost
                 device, exit 3; a low battery, exit 4), the checkpoint interval
  evaluation.py  the eval split's loss and metric, on rank 0
  best.py        best-k checkpoints and early stopping by CONFIG_CHECKPOINT_BEST_METRIC
  initial.py     INIT_FROM: a new run from trained weights, checked by name and shape
  schedule.py    the learning-rate schedule
  timing.py      the first steps' time against the plan's prediction; calibrating lib.steptime
  trial.py       where the first steps miss the predicted interval: the runner-up micro-batches timed, the
                 fastest kept (one process, eager)
  ending.py      after the last step: the final evaluation and checkpoint, then bookkeeping whose failure is a
                 warning (the step-time report, the last metrics line, closing the monitor and trackers)
"""

from .evaluation import Evaluator
from .loop import OnEval, Trainer, TrainResult, train
from .resume import TrainingInterrupted, versions
from .rundir import run_directory
from .schedule import lr_at
from .windows import Progress, epoch_micro_batches, split_batches

__all__ = ["Evaluator", "OnEval", "Progress", "TrainResult", "Trainer", "TrainingInterrupted", "epoch_micro_batches",
           "lr_at", "run_directory", "split_batches", "train", "versions"]
