"""The learning-rate range test (Smith 2017): sweep the LR exponentially for a few steps, read the loss.

The core, `range_test`, knows nothing of kfit: it takes a model, an optimizer
(or a factory for one), an iterator of (inputs, targets) batches and a loss
function, so the synthetic least-squares test and `make find-lr` run the same
code. `find_lr` feeds it the configured Task at the per-device micro-batch.

The suggestion rule
-------------------
The range test measures one thing reliably: the *edge* of the usable range,
the largest LR at which the loss still falls. Past it the loss turns up and
then explodes; the minimum of the smoothed loss marks it. For a quadratic
(least squares) with largest curvature L, plain gradient descent diverges
above 2/L, the edge, and the best constant step for the stiffest direction
(the one that bounds the step) is 1/L, half of it (2/(L+mu) for the
worst-case rate, within a factor 2 of 1/L for any condition number).
Because the EMA lags and the sweep keeps raising the LR while the loss
turns, the observed minimum sits past the true edge (measured on minibatch
least squares at the default sweep: 1.2-2.6 x 2/L); so we suggest

    suggestion = LR at the minimum of the smoothed loss / EDGE_FACTOR (3)

which lands at 0.8-1.7 x 1/L there (tested within a factor 3 of 1/L), and
for LeNet-5 on the digits (AdamW, batch 64) gives 0.01-0.03, where a grid of
5-epoch runs found 0.01-0.02 best. The rule needs noisy (minibatch)
gradients, as every real range test has: full-batch gradient descent on a
quadratic it has already solved has nothing left in the stiff direction to
amplify, and its loss turns up only at about 5-10/L.

The rate for the effective batch
--------------------------------
The sweep steps at one batch B (one process, no accumulation), while training
steps at the effective batch E = micro-batch x accumulation x processes. A
rate found at B is converted to E by a stated rule (CONFIG_LR_SCALING_*):
linear, lr x E/B, for SGD (Goyal et al. 2017: k times the batch averages k
times the noise away, so k times the step keeps the progress per sample);
square root, lr x sqrt(E/B), for Adam and AdamW, whose update is normalised by
the gradient's scale (Malladi et al. 2022, the square-root scaling rule for
adaptive methods); or none. `make find-lr` prints both rates and APPLY=1
writes the converted one.

Why not the steepest descent of the loss (Lightning's and torch-lr-finder's
default)? Where the loss falls fastest depends on the sweep, not the problem:
the loss falls once the *accumulated* LR, about lr x r/(r-1) for a growth
factor r per step, reaches 1/curvature, so the steepest point moves with the
number of steps (at 100 steps over 8 decades it is ~12x below 1/L), and on a
noisy curve it jumps between local wiggles. The minimum is a single, stable
feature. The steepest point before the minimum is still reported, for
comparison, as `steepest_lr`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from .errors import KfitError
from .progress import Bar
from .units import gib

EDGE_FACTOR = 3.0

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]


@dataclass(frozen=True)
class RangeTest:
    """One sweep: the LRs tried, the raw and smoothed losses, where it stopped and what it suggests."""

    lrs: tuple[float, ...]
    losses: tuple[float, ...]  # raw loss of each step
    smoothed: tuple[float, ...]  # bias-corrected EMA of the losses
    stop_reason: str  # diverged | max_lr | data
    seconds: float
    min_lr: float | None = None  # LR at the minimum of the smoothed loss
    steepest_lr: float | None = None  # steepest fall of the smoothed loss before its minimum
    suggestion: float | None = None  # min_lr / EDGE_FACTOR

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def lr_schedule(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """`steps` learning rates growing by a constant factor from min_lr to max_lr."""
    ratio = max_lr / min_lr
    return [min_lr * ratio ** (i / (steps - 1)) for i in range(steps)]


def suggest(lrs, smoothed) -> tuple[float | None, float | None, float | None]:
    """(LR at the smoothed minimum, steepest LR before it, suggestion); Nones when the curve never fell."""
    if len(smoothed) < 3:
        return None, None, None
    low = min(range(len(smoothed)), key=smoothed.__getitem__)
    if low == 0:  # the loss only rose: the whole range is too high
        return None, None, None
    # Slope per log-LR step; the sweep's LRs are equally spaced in log, so a plain difference will do.
    slopes = [smoothed[i + 1] - smoothed[i] for i in range(low)]
    steep = min(range(low), key=slopes.__getitem__)
    return lrs[low], lrs[steep], lrs[low] / EDGE_FACTOR


def range_test(model: torch.nn.Module, optimizer: torch.optim.Optimizer | OptimizerFactory,
               batches: Iterator[Batch], loss_fn: LossFn, *, min_lr: float = 1e-7, max_lr: float = 10.0,
               steps: int = 100, smoothing: float = 0.05, diverge: float = 4.0,
               autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
               scaler: torch.amp.GradScaler | None = None,
               on_step: Callable[[float, float], None] | None = None) -> RangeTest:
    """Run the sweep and restore the model and the optimizer exactly as they were.

    `optimizer` is an optimizer over the model's parameters (its state, momentum
    buffers say, is put back afterwards) or a factory `f(model)` for a fresh one.
    The loss is smoothed with an exponential moving average in which each new
    loss weighs `smoothing`, bias-corrected as in Adam so the first steps are
    not pulled towards zero; the sweep stops when that exceeds `diverge` x its
    best so far, or when a loss is not finite.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(model)
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    was_training = model.training
    lrs, losses, smoothed = [], [], []
    average, best, stop = 0.0, math.inf, "max_lr"
    start = time.perf_counter()
    model.train()
    try:
        for step, lr in enumerate(lr_schedule(min_lr, max_lr, steps)):
            try:
                x, y = next(batches)
            except StopIteration:
                stop = "data"
                break
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            value = loss.item()
            if not math.isfinite(value):
                stop = "diverged"
                break
            average = (1 - smoothing) * average + smoothing * value
            lrs.append(lr)
            losses.append(value)
            smoothed.append(average / (1 - (1 - smoothing) ** (step + 1)))
            best = min(best, smoothed[-1])
            if on_step is not None:
                on_step(lr, smoothed[-1])
            if smoothed[-1] > diverge * best:
                stop = "diverged"
                break
    finally:
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
    low, steep, suggestion = suggest(lrs, smoothed)
    return RangeTest(lrs=tuple(lrs), losses=tuple(losses), smoothed=tuple(smoothed), stop_reason=stop,
                     seconds=time.perf_counter() - start, min_lr=low, steepest_lr=steep, suggestion=suggestion)


# --------------------------------------------------------------------------
# The rate for the effective batch

RULES = {"linear": "linear", "sqrt": "square-root", "none": "no"}


@dataclass(frozen=True)
class Scaling:
    """How a rate found at `measured_batch` converts to `effective_batch`, and why that rule."""

    rule: str  # linear | sqrt | none
    why: str  # the setting that chose it
    measured_batch: int
    effective_batch: int

    @property
    def factor(self) -> float:
        ratio = self.effective_batch / self.measured_batch
        return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.rule]

    def convert(self, lr: float) -> float:
        return lr * self.factor

    def describe(self) -> str:
        """'square-root scaling (CONFIG_LR_SCALING_AUTO, adamw): x sqrt(512 / 64) = x2.83'."""
        ratio = f"{self.effective_batch} / {self.measured_batch}"
        how = {"linear": f"x {ratio}", "sqrt": f"x sqrt({ratio})", "none": "x 1"}[self.rule]
        return f"{RULES[self.rule]} scaling ({self.why}): {how} = x{self.factor:.3g}"


def scaling_for(config, measured_batch: int, effective_batch: int) -> Scaling:
    """The rule CONFIG_LR_SCALING_* names; AUTO: linear for SGD, square root for Adam and AdamW."""
    if config.lr_scaling == "auto":
        rule = "linear" if config.optimizer == "sgd" else "sqrt"
        why = f"CONFIG_LR_SCALING_AUTO, {config.optimizer}"
    else:
        rule, why = config.lr_scaling, f"CONFIG_LR_SCALING_{config.lr_scaling.upper()}"
    return Scaling(rule, why, measured_batch, effective_batch)


# --------------------------------------------------------------------------
# The configured model: what `make find-lr` runs


NEAR_MEMORY = 0.9  # warn when the predicted peak exceeds this share of the budget


def memory_warning(plan, hardware, batch: int) -> str | None:
    """A warning when the range test at `batch` may not fit, or None.

    The plan's predicted peak (memory planner; absent under other policies) is
    for its own micro-batch; it is scaled linearly to `batch`, which overstates
    it slightly (parameters and optimizer state do not grow with the batch).
    """
    peak = getattr(plan, "predicted_peak_bytes", None)
    if peak:
        budget = getattr(plan, "budget_bytes", None)
        gpu = hardware.primary_gpu if plan.device_type != "cpu" else None
        limit = budget or (gpu.total_bytes if gpu else hardware.cpu.ram_available_bytes)
        scaled = peak * batch / plan.micro_batch
        if scaled > NEAR_MEMORY * limit:
            return (f"batch {batch}: predicted peak {gib(scaled):.2f}GiB is {scaled / limit:.0%} of the "
                    f"{'memory budget' if budget else 'device memory'} ({gib(limit):.2f}GiB): it may run out "
                    f"of memory; lower BATCH=")
        return None
    if batch > plan.micro_batch:
        return (f"BATCH={batch} is above the plan's micro-batch {plan.micro_batch}, and this plan has no "
                "memory prediction to check it against: it may run out of memory")
    return None


def task_batches(task, batch: int, seed: int, device: torch.device) -> Iterator[Batch]:
    """The training split in the trainer's sample order, epoch after epoch, on `device`."""
    from .trainer.windows import epoch_micro_batches

    epoch = 0
    while True:
        for indices in epoch_micro_batches(len(task.train), batch, seed, epoch):
            x, y = task.train[indices]
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        epoch += 1


def find_lr(config, plan, *, batch: int, runs: int = 1, task=None) -> list[RangeTest]:
    """`runs` range tests of the configured model and optimizer at `batch`, with seeds seed, seed+1, ...

    One process on one device, whatever the config's world size: `batch` is the
    per-device micro-batch, not the global effective batch.
    """
    from .task import load_task
    from .step import autocast_for, configure_backends, make_optimizer, seed_everything

    task = task or load_task(config)
    if batch > len(task.train):  # every step would train on all the samples, not on `batch` of them
        raise KfitError(f"batch {batch} is larger than the training set ({len(task.train):,} samples), so each step "
                        f"could use only {len(task.train):,}: give BATCH={len(task.train)} or less")
    device = torch.device(plan.device_type)
    configure_backends(plan)
    results = []
    with Bar(runs * config.lr_finder_steps, "find-lr") as bar:
        for run in range(runs):
            seed = config.seed + run
            seed_everything(seed)
            model = task.build(plan.gradient_checkpointing).to(device)
            results.append(range_test(
                model, lambda m: make_optimizer(config, m), task_batches(task, batch, seed, device), task.loss,
                min_lr=config.lr_finder_min_lr, max_lr=config.lr_finder_max_lr, steps=config.lr_finder_steps,
                smoothing=config.lr_finder_smoothing, diverge=config.lr_finder_diverge,
                autocast=lambda: autocast_for(plan),
                scaler=torch.amp.GradScaler(plan.device_type) if plan.grad_scaler else None,
                on_step=lambda lr, loss: bar.update(postfix=f"run {run + 1}/{runs}, lr {lr:.2e}, loss {loss:.4g}")))
            bar.update((run + 1) * config.lr_finder_steps - bar.done)  # the steps a diverged run skipped
    return results


@dataclass(frozen=True)
class Summary:
    suggestion: float | None  # median over the runs that gave one
    low: float | None
    high: float | None
    runs: int
    failed: int  # runs whose loss never fell

    @property
    def spread(self) -> float | None:
        """max / min of the suggestions: 1 when the runs agree."""
        return self.high / self.low if self.low else None


def summarize(results: list[RangeTest]) -> Summary:
    found = [r.suggestion for r in results if r.suggestion is not None]
    if not found:
        return Summary(None, None, None, len(results), len(results))
    return Summary(statistics.median(found), min(found), max(found), len(results), len(results) - len(found))


def rounded(lr: float) -> float:
    """Two significant digits: the test cannot resolve more, and the .config stays readable."""
    return float(f"{lr:.2g}")


# --------------------------------------------------------------------------
# The HTML page


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


@dataclass
class _Axes:
    """Maps (log10 LR, loss) onto an SVG box; losses above `top` are drawn at the top edge.

    width and height are the viewBox's: the page draws the SVG at 100% of its column, so the chart
    shrinks with the window. The top margin is a strip above the plot: the median suggestion's label
    on one row, each run's minimum marker under it, so neither covers the other."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 760
    height: int = 400
    margin: tuple[int, int, int, int] = (40, 20, 50, 70)  # top, right, bottom, left
    ticks: list = field(default_factory=list)
    label_y: int = 14  # baseline of the suggestion's label, in the strip
    marker_y: int = 33  # tip of the minimum markers, just above the plot

    def x(self, lr: float) -> float:
        top, right, bottom, left = self.margin
        return left + (math.log10(lr) - self.x0) / (self.x1 - self.x0) * (self.width - left - right)

    def y(self, loss: float) -> float:
        top, right, bottom, left = self.margin
        clipped = min(max(loss, self.y0), self.y1)
        return top + (self.y1 - clipped) / (self.y1 - self.y0) * (self.height - top - bottom)

    def points(self, lrs, losses) -> str:
        return " ".join(f"{self.x(lr):.1f},{self.y(v):.1f}" for lr, v in zip(lrs, losses))

    def marker(self, lr: float) -> str:
        """A small triangle pointing down at `lr` on the plot's top edge."""
        x, tip = self.x(lr), self.marker_y
        return f"{x - 5:.1f},{tip - 8} {x + 5:.1f},{tip - 8} {x:.1f},{tip}"

    def label(self, x: float, room: float = 170) -> dict:
        """Where a label at `x` goes in the strip: right of the line, or left of it near the right edge."""
        right = self.width - self.margin[1]
        return {"x": round(x - 5 if x > right - room else x + 5, 1), "anchor": "end" if x > right - room else "start"}


def _axes(results: list[RangeTest]) -> _Axes:
    lrs = [lr for r in results for lr in r.lrs]
    # The y range covers the smoothed curves up to their minimum, with room above: the divergence
    # spike at the end would otherwise flatten everything that matters.
    useful = [v for r in results for v in r.smoothed[:r.smoothed.index(min(r.smoothed)) + 1]] or [0.0, 1.0]
    low, high = min(useful), max(useful)
    pad = 0.1 * (high - low or abs(high) or 1.0)
    axes = _Axes(math.floor(math.log10(min(lrs))), math.ceil(math.log10(max(lrs))), low - pad, high + 2 * pad)
    axes.ticks = [(axes.x(10.0 ** e), f"1e{e}") for e in range(int(axes.x0), int(axes.x1) + 1)]
    return axes


def render_report(results: list[RangeTest], summary: Summary, *, title: str, facts: list[tuple[str, str]]) -> str:
    """A self-contained HTML page: facts, the suggestion, and an inline SVG of loss against LR."""
    import jinja2

    axes = _axes(results)
    y_ticks = [(axes.y(v), f"{v:.3g}") for v in (axes.y0 + (axes.y1 - axes.y0) * i / 4 for i in range(5))]
    curves = [{"color": COLORS[i % len(COLORS)], "seed_offset": i, "raw": axes.points(r.lrs, r.losses),
               "smoothed": axes.points(r.lrs, r.smoothed), "result": r,
               "suggestion_x": axes.x(r.suggestion) if r.suggestion else None,
               "min_marker": axes.marker(r.min_lr) if r.min_lr else None} for i, r in enumerate(results)]
    median_x = axes.x(summary.suggestion) if summary.suggestion else None
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    return env.get_template("lr_finder.html.j2").render(
        title=title, facts=facts, summary=summary, curves=curves, axes=axes, y_ticks=y_ticks, median_x=median_x,
        median_label=axes.label(median_x) if median_x is not None else None, edge_factor=EDGE_FACTOR)
