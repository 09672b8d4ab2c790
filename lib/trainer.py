"""The one training loop, for every model. It reads only the Config and the Plan.

Gradient accumulation is exactly one large batch: each micro-batch's mean loss
is weighted by its share of the samples in its optimizer step, so a short last
window of an epoch (or a short last micro-batch) weighs what it should, and
micro-batch b with accumulation k ends with the same weights as b*k with 1
(to float rounding; BatchNorm is the exception, as its batch statistics are
computed per micro-batch in any framework).
The sample order is a function of (seed, epoch) only, never of the batch
size, which is what makes that equivalence (and later exact resume) hold.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader

from . import checkpoint
from .config import Config
from .data import BatchSplit
from .hardware import HardwareProfile
from .hyperparams import Plan
from .models import count_parameters
from .task import Task, load_task

Log = Callable[[str], None]
# Called after every evaluation with (optimizer step, epoch, metrics); an exception it raises
# (optuna.TrialPruned, say) ends training and propagates to the caller of train().
OnEval = Callable[[int, int, dict], None]


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    epochs: float
    samples: int
    seconds: float
    stop_reason: str
    final_eval: dict
    history: list[dict] = field(default_factory=list)


# --------------------------------------------------------------------------
# Building the pieces


def make_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    # Decay weight matrices and kernels only; biases and norm scales are not regularised.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    lr = config.learning_rate
    if config.optimizer == "sgd":
        momentum = config.sgd_momentum or 0.0
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0)
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr)
    return torch.optim.AdamW(groups, lr=lr)


def lr_at(config: Config, step: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to 10% or constant."""
    peak = config.learning_rate
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return peak
    span = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def epoch_micro_batches(num_samples: int, micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's sample order, cut into micro-batches. Order depends on (seed, epoch) only."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    batches = [order[i:i + micro_batch] for i in range(0, num_samples, micro_batch)]
    # A lone trailing sample would break BatchNorm's training statistics: fold it into the previous batch.
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2].extend(batches.pop())
    return batches


def run_directory(config: Config) -> Path:
    base = Path(config.output_dir)
    if config.run_name:
        return base / config.run_name
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = f"{config.model}-{config.gpt2_preset}" if config.gpt2_preset else config.model
    path = base / f"{label}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{label}-{stamp}-{n}"
    return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def configure_backends(plan: Plan) -> None:
    if plan.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = plan.tf32
        torch.backends.cudnn.allow_tf32 = plan.tf32
        torch.backends.cudnn.benchmark = plan.cudnn_benchmark


def autocast_for(plan: Plan):
    """The autocast context of the plan's precision (a no-op for fp32)."""
    if plan.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if plan.precision == "bf16" else torch.float16
    return torch.autocast(plan.device_type, dtype=dtype)


def versions() -> dict:
    return {"torch": str(torch.__version__), "python": platform.python_version(),
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}


# --------------------------------------------------------------------------
# The loop


class Trainer:
    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, *,
                 run_dir: Path | None = None, log: Log = print, task: Task | None = None,
                 on_eval: OnEval | None = None) -> None:
        self.config, self.plan, self.hardware, self.log = config, plan, hardware, log
        self.on_eval = on_eval
        seed_everything(config.seed)
        configure_backends(plan)
        self.device = torch.device(plan.device_type)
        self.task = task or load_task(config)
        self.train_split, self.eval_split, self.info = self.task.train, self.task.eval, self.task.info
        self.loss_fn = self.task.loss
        self.model = self.task.build(plan.gradient_checkpointing).to(self.device)
        self.parameters = count_parameters(self.model)
        self.optimizer = make_optimizer(config, self.model)
        self.forward = torch.compile(self.model, mode=plan.compile_mode) if plan.compile else self.model
        self.scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.grad_scaler)
        self.run_dir = run_dir or run_directory(config)
        self.windows_per_epoch = math.ceil(
            len(epoch_micro_batches(len(self.train_split), plan.micro_batch, 0, 0)) / plan.grad_accum)
        total = config.epochs * self.windows_per_epoch
        self.total_steps = min(total, config.max_steps) if config.max_steps else total

    # -- pieces of a step ----------------------------------------------------

    def autocast(self):
        return autocast_for(self.plan)

    def loader(self, split: BatchSplit, batches: list[list[int]]) -> DataLoader:
        return DataLoader(split, sampler=batches, batch_size=None, num_workers=self.plan.num_workers,
                          pin_memory=self.plan.pin_memory)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def optimizer_step(self, window: list[list[int]], batches_iter, step: int) -> float:
        """Forward/backward every micro-batch of one window, then one optimizer step. Returns the mean loss."""
        window_samples = sum(len(b) for b in window)
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for indices in window:
            x, y = self.to_device(*next(batches_iter))
            with self.autocast():
                loss = self.loss_fn(self.forward(x), y)
            self.scaler.scale(loss * (len(indices) / window_samples)).backward()
            total += loss.detach() * len(indices)
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.config, step, self.total_steps)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return total.item() / window_samples

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        n = len(self.eval_split)
        batches = [list(range(i, min(i + self.plan.eval_batch, n))) for i in range(0, n, self.plan.eval_batch)]
        loss_sum, correct = 0.0, 0
        for x, y in self.loader(self.eval_split, batches):
            x, y = self.to_device(x, y)
            with self.autocast():
                logits = self.forward(x)
            loss_sum += self.loss_fn(logits, y).item() * len(y)
            if self.info.kind == "image":
                correct += (logits.argmax(dim=-1) == y).sum().item()
        self.model.train()
        loss = loss_sum / n
        if self.info.kind == "image":
            return {"eval_loss": loss, "accuracy": correct / n}
        if self.info.kind == "text":
            return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        return {"eval_loss": loss}

    # -- the run -------------------------------------------------------------

    def write_run_files(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text_atomic(self.run_dir / "config", self.config.text)
        checkpoint.write_json_atomic(self.run_dir / "plan.json", self.plan.to_dict())
        checkpoint.write_json_atomic(self.run_dir / "hardware.json", self.hardware.to_dict())

    def save(self, step: int, epoch: int, final_eval: dict) -> Path:
        path = self.run_dir / "checkpoint.pt"
        checkpoint.save_checkpoint(path, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "step": step, "epoch": epoch, "eval": final_eval,
            "config": self.config.text, "plan": self.plan.to_dict(), "hardware": self.hardware.to_dict(),
            "versions": versions()})
        return path

    def fit(self) -> TrainResult:
        config, plan, log = self.config, self.plan, self.log
        self.write_run_files()
        log(f"Data: {self.info.description}")
        log(f"Model: {config.model}{'-' + config.gpt2_preset if config.gpt2_preset else ''}, "
            f"{self.parameters:,} parameters, on {plan.device_type} ({plan.precision}); "
            f"{self.total_steps} optimizer steps of {plan.effective_batch} samples")
        log(f"Run directory: {self.run_dir}")
        metrics_file = open(self.run_dir / "metrics.jsonl", "w")
        tokens_per_sample = self.info.block_size or 0
        history: list[dict] = []

        def record(entry: dict) -> None:
            history.append(entry)
            metrics_file.write(json.dumps(entry) + "\n")
            metrics_file.flush()

        self.model.train()
        start = time.perf_counter()
        interval_start, interval_samples, interval_loss, interval_steps = start, 0, 0.0, 0
        step, samples, stop_reason, epoch = 0, 0, "epochs", 0
        try:
            for epoch in range(config.epochs):
                batches = epoch_micro_batches(len(self.train_split), plan.micro_batch, config.seed, epoch)
                windows = [batches[i:i + plan.grad_accum] for i in range(0, len(batches), plan.grad_accum)]
                batches_iter = iter(self.loader(self.train_split, batches))
                for window in windows:
                    loss = self.optimizer_step(window, batches_iter, step)
                    if not math.isfinite(loss):
                        raise FloatingPointError(
                            f"loss became {loss} at step {step + 1}: lower CONFIG_LEARNING_RATE "
                            f"(now {config.learning_rate:g}) or enable CONFIG_GRAD_CLIP")
                    window_samples = sum(len(b) for b in window)
                    step += 1
                    samples += window_samples
                    interval_samples += window_samples
                    interval_loss += loss * window_samples
                    interval_steps += 1
                    if step % config.log_interval == 0 or step == self.total_steps:
                        now = time.perf_counter()
                        rate = interval_samples / max(now - interval_start, 1e-9)
                        entry = {"step": step, "epoch": epoch + 1, "loss": interval_loss / interval_samples,
                                 "lr": self.optimizer.param_groups[0]["lr"], "samples_per_s": rate,
                                 "elapsed_s": now - start}
                        if tokens_per_sample:
                            entry["tokens_per_s"] = rate * tokens_per_sample
                        record(entry)
                        log(self.format_progress(entry))
                        interval_start, interval_samples, interval_loss, interval_steps = now, 0, 0.0, 0
                    if config.eval_interval and step % config.eval_interval == 0 and step < self.total_steps:
                        self.log_eval(record, step, epoch + 1)
                    if config.max_steps and step >= config.max_steps:
                        stop_reason = "max_steps"
                        break
                    if config.time_limit_s and time.perf_counter() - start >= config.time_limit_s:
                        stop_reason = "time_limit"
                        break
                if stop_reason != "epochs":
                    break
                if not config.eval_interval and epoch + 1 < config.epochs:
                    self.log_eval(record, step, epoch + 1)
            seconds = time.perf_counter() - start
            final = self.log_eval(record, step, epoch + 1, final=True)
            path = self.save(step, epoch + 1, final)
            log(f"Saved {path} ({stop_reason}: {step} steps, {samples:,} samples in {seconds:.1f}s)")
        finally:
            metrics_file.close()
        return TrainResult(run_dir=self.run_dir, steps=step, epochs=samples / len(self.train_split),
                           samples=samples, seconds=seconds, stop_reason=stop_reason, final_eval=final,
                           history=history)

    def log_eval(self, record, step: int, epoch: int, final: bool = False) -> dict:
        result = self.evaluate()
        record({"step": step, "epoch": epoch, **result, **({"final": True} if final else {})})
        parts = [f"eval loss {result['eval_loss']:.4f}"]
        if "accuracy" in result:
            parts.append(f"accuracy {result['accuracy']:.2%}")
        if "perplexity" in result:
            parts.append(f"perplexity {result['perplexity']:.2f}")
        self.log(f"{'final ' if final else ''}eval @ step {step} (epoch {epoch}): {', '.join(parts)}")
        if self.on_eval is not None:
            self.on_eval(step, epoch, result)
        return result

    def format_progress(self, entry: dict) -> str:
        line = (f"step {entry['step']:>5}/{self.total_steps} | epoch {entry['epoch']:>3} | "
                f"loss {entry['loss']:.4f} | lr {entry['lr']:.2e} | {entry['samples_per_s']:,.0f} samples/s")
        if "tokens_per_s" in entry:
            line += f" | {entry['tokens_per_s']:,.0f} tokens/s"
        return line


def train(config: Config, plan: Plan, hardware: HardwareProfile, *, run_dir: Path | None = None,
          log: Log = print, task: Task | None = None, on_eval: OnEval | None = None) -> TrainResult:
    """Train as configured and planned; returns where the run went and how it ended."""
    return Trainer(config, plan, hardware, run_dir=run_dir, log=log, task=task, on_eval=on_eval).fit()
