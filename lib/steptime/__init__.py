"""Step time, predicted before a run: counted work over the device's speed, refined by measurement.

    count.py      FLOPs, bytes and ops of a micro-batch's forward+backward and of the optimizer step,
                  counted under fake tensors; cached
    device.py     peak FLOP/s per precision, bandwidth, overheads, power: the catalog for GPUs,
                  a cached micro-benchmark for this CPU
    model.py      StepTimeModel: the roofline per micro-batch, measured efficiency, calibration
    measure.py    real micro-batch timings on this CPU where they are cheap; cached
    calibrate.py  step_time_model, predict_step_time, calibrate (after a run's first steps), plan_predictions
    choose.py     the fastest micro-batch (and checkpointing) among those that fit
"""

from .calibrate import (
    CALIBRATION_FILE, MEASURE_ENV, StepTime, calibrate, evaluations, model_for_plan, plan_predictions,
    predict_step_time, run_steps, step_time, step_time_model,
)
from .choose import Candidate, balanced_micro_batches, candidates, fastest, ties
from .count import COUNT_BATCHES, Counts, Phase, StepCounter, count_step
from .device import Device, device_for, gpu_device, measure_cpu
from .model import StepTimeModel, calibrated, window_sizes

__all__ = [
    "CALIBRATION_FILE", "COUNT_BATCHES", "MEASURE_ENV", "Candidate", "Counts", "Device", "Phase",
    "StepCounter", "StepTime", "StepTimeModel", "balanced_micro_batches", "calibrate", "calibrated", "candidates", "count_step",
    "device_for", "evaluations", "fastest", "gpu_device", "measure_cpu", "model_for_plan", "plan_predictions",
    "predict_step_time", "run_steps", "step_time", "step_time_model", "ties", "window_sizes",
]
