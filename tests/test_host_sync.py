"""The steady-state training step reads nothing back from the device (lib/trainer/agreement.py): the loss stays
a device tensor until a log line, an evaluation, a checkpoint or a stop needs it, and the step's flags are agreed
over a host (gloo) group where the default group's collectives run on the device. The two-rank tests run that
host-group path on this CPU with gloo (host_flags=True), the code NCCL runs take."""

from __future__ import annotations

import json
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lib.trainer import agreement
from lib.trainer.agreement import Agreed, Agreement, Losses
from lib.trainer.engine import Engine
from lib.trainer.loop import Trainer
from lib.trainer.timing import StepTimer
from tests.helpers import manual, run

CPU = torch.device("cpu")


def test_losses_are_read_in_one_transfer_in_order(monkeypatch):
    losses = Losses()
    losses.add(1, 8, torch.tensor(4.0))
    losses.add(2, 8, 2.5)  # a float where reading it cost nothing (gloo)
    losses.add(3, 4, torch.tensor(float("inf")))
    stacks = []
    real_stack = torch.stack
    monkeypatch.setattr(agreement.torch, "stack", lambda ts: stacks.append(len(ts)) or real_stack(ts))
    assert losses.read() == [(1, 8, 4.0), (2, 8, 2.5), (3, 4, math.inf)]
    assert stacks == [2] and losses.read() == []


def test_one_process_agrees_with_itself_and_keeps_the_loss_on_the_device():
    one = Agreement(CPU, active=False)
    loss = torch.tensor(3.0)
    agreed, total = one.step(False, True, False, True, False, loss)
    assert agreed == Agreed(oom=False, time_limit=True, signal=False, checkpoint_due=True, battery_stop=False)
    assert total is loss  # not read
    assert one.step(True, False, False, False, False, None) == (Agreed(True, False, False, False, False), None)


def _two_ranks(rank: int, path: str, host_flags: bool, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    try:
        ranks = Agreement(CPU, active=True, host_flags=host_flags)
        results = []
        # rank 0 finds a checkpoint due; rank 1 got a signal: both learn both, and the loss sum over the ranks
        agreed, total = ranks.step(False, False, rank == 1, rank == 0, False, torch.tensor(1.0 + rank))
        results.append([agreed.__dict__, total.item() if isinstance(total, torch.Tensor) else total,
                        isinstance(total, torch.Tensor)])
        # rank 1 ran out of memory: both redo the step, no loss
        agreed, total = ranks.step(rank == 1, False, False, False, False, None if rank == 1 else torch.tensor(5.0))
        results.append([agreed.__dict__, total, False])
        with open(f"{out}.{rank}", "w") as f:
            json.dump(results, f)
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.mark.parametrize("host_flags", [True, False], ids=["host-group (NCCL's path)", "gloo"])
def test_two_ranks_agree_on_every_flag_and_sum_the_loss(host_flags, tmp_path):
    path = tempfile.mktemp(dir=tmp_path)
    mp.start_processes(_two_ranks, args=(path, host_flags, str(tmp_path / "out")), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        first, oom = json.loads((tmp_path / f"out.{rank}").read_text())
        assert first[0] == {"oom": False, "time_limit": False, "signal": True, "checkpoint_due": True,
                            "battery_stop": False}
        assert first[1] == 3.0 and first[2] is host_flags  # on the device (unread) only on the host-group path
        assert oom[0]["oom"] is True and oom[1] is None


def _counting(monkeypatch, config_text: str, make_config, nan_at: int | None = None):
    """A LeNet-5 run with the step timer done from the first step on; returns the steps whose losses were read
    (each read's last step) and the exception, if any."""
    monkeypatch.setattr(StepTimer, "record", lambda self, plan, seconds, mark=None: setattr(self, "done", True))
    reads, inside = [], []
    real_read, real_step = Losses.read, Trainer.optimizer_step

    def read(self):
        values = real_read(self)
        if values:  # an empty read transfers nothing
            reads.append(values[-1][0])
        return values

    def optimizer_step(self, *args):
        inside.append(True)
        try:
            return real_step(self, *args)
        finally:
            inside.pop()

    losses, real_accumulate = set(), Engine.accumulate

    def accumulate(self, window, step, plan, micro_batch):
        total = real_accumulate(self, window, step, plan, micro_batch)
        if nan_at is not None and step + 1 == nan_at:
            total = total * math.nan
        losses.add(id(total))
        return total

    def reader(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args):
            assert not (inside and id(self) in losses), f"the step's loss read back ({name}) inside the step"
            return real(self, *args)
        return read

    monkeypatch.setattr(Losses, "read", read)
    monkeypatch.setattr(Trainer, "optimizer_step", optimizer_step)
    monkeypatch.setattr(Engine, "accumulate", accumulate)
    for name in ("item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, reader(name))
    config = make_config(manual(16, 1, config_text))
    try:
        trainer, result = run(config)
    except FloatingPointError as err:
        return reads, err, None
    return reads, None, trainer


def test_the_steady_state_step_reads_nothing_back(make_config, monkeypatch):
    reads, error, trainer = _counting(monkeypatch, "CONFIG_MAX_STEPS=12\nCONFIG_LOG_INTERVAL=5\n"
                                      "CONFIG_EVAL_INTERVAL=0\n", make_config)
    assert error is None
    assert reads == [1, 5, 10, 12]  # the step timer's step, the log lines, the last step
    lines = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if "loss" in line and "eval_loss" not in line]
    assert [line["step"] for line in logged] == [5, 10, 12] and all(math.isfinite(line["loss"]) for line in logged)


def test_divergence_between_reads_is_named_at_its_step_before_the_next_log_line(make_config, monkeypatch):
    reads, error, _ = _counting(monkeypatch, "CONFIG_MAX_STEPS=12\nCONFIG_LOG_INTERVAL=5\nCONFIG_EVAL_INTERVAL=0\n",
                                make_config, nan_at=7)
    assert str(error).startswith("loss became nan at step 7: lower CONFIG_LEARNING_RATE")
    assert reads == [1, 5, 10]  # found when step 10's log line read it, before that line was written


def test_the_losses_a_checkpoint_holds_are_read_first(make_config, monkeypatch):
    """A periodic checkpoint at a step that is no log line holds the interval's loss as every step read it."""
    from lib.trainer.checkpoints import Checkpoints

    saved, real_save = [], Checkpoints.save_periodic

    def save_periodic(self):
        p = self.recovery.progress
        saved.append((p.step, p.interval_samples, p.interval_loss))
        return real_save(self)
    monkeypatch.setattr(Checkpoints, "save_periodic", save_periodic)
    reads, error, trainer = _counting(monkeypatch, "CONFIG_MAX_STEPS=9\nCONFIG_LOG_INTERVAL=100\n"
                                      "CONFIG_EVAL_INTERVAL=0\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\n"
                                      "CONFIG_CHECKPOINT_EVERY_STEPS=4\n", make_config)
    assert error is None and reads == [1, 4, 8, 9]
    assert [(step, samples) for step, samples, _ in saved] == [(4, 64), (8, 128)]
    assert all(2.0 * samples < loss < 2.5 * samples for _, samples, loss in saved)  # ln 10 = 2.30 per sample
