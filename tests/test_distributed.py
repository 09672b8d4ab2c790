"""Several processes: the torchrun command, the process count, and a real 2-process gloo run on the CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from lib import config as kc, distributed, torchrun_output
from lib.checkpoint import FINAL, load_checkpoint
from lib.errors import KfitError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from tests.helpers import CPU, counting_resolves, manual, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "kfit.py"


def test_torchrun_command_for_one_and_several_machines():
    one = distributed.torchrun_command(4, SCRIPT, {})
    assert one[1:] == ["-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone", str(SCRIPT), "train"]
    many = distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    assert many[5:-2] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
    with pytest.raises(KfitError, match="MASTER_ADDR"):
        distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "0"})
    with pytest.raises(KfitError, match="NODE_RANK='2'"):
        distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "x"})


def test_process_count(make_config):
    from lib.planning import process_count

    config = make_config("")
    four = resolve_hardware(gpu="h100", gpus=4)
    assert process_count(config, four, "cuda") == (4, "AUTO: 4 identical GPUs")
    assert process_count(config, CPU, "cpu")[0] == 1
    assert process_count(config, CPU, "cpu", 2) == (2, "GPUS=2")
    manual_config = make_config("CONFIG_NPROC_MANUAL=y\nCONFIG_NPROC=3\n")
    assert process_count(manual_config, four, "cuda")[0] == 3
    with pytest.raises(KfitError, match="GPUS='0' is too small: give a whole number from 1 to 4,096"):
        process_count(config, CPU, "cpu", 0)


def test_each_rank_plans_for_its_own_gpu_and_mixed_models_for_the_smallest(make_config):
    h100s = resolve_hardware(gpu="h100", gpus=2)
    rank1 = distributed.Rank(rank=1, local_rank=1, world_size=2, local_world_size=2)
    assert distributed.hardware_for_rank(h100s, rank1).primary_gpu.index == 1
    small = dataclasses.replace(resolve_hardware(gpu="a10g").primary_gpu, index=1)
    mixed = dataclasses.replace(h100s, gpus=(h100s.gpus[0], small))
    rank0 = dataclasses.replace(rank1, rank=0, local_rank=0)
    config = kc.derive(make_config("CONFIG_TARGET_EFFECTIVE_BATCH=64\n"), {"DEVICE_AUTO": True})
    model = ModelDescription.from_config(config)
    # every rank, whichever GPU is its own, runs the plan sized for the smallest GPU, and says so
    plans = [resolve(config, distributed.hardware_for_rank(mixed, rank), model, 2) for rank in (rank0, rank1)]
    for plan in plans:
        assert plan.device_name == small.name and plan.budget_bytes == plans[0].budget_bytes
        [note] = [n for n in plan.notes if "differ" in n]
        assert "sized for the smallest, GPU 1 NVIDIA A10G" in note
    assert plans[0].budget_bytes < resolve(config, h100s, model, 2).budget_bytes
    # one process uses GPU 0 only: its plan is GPU 0's, without the note
    single = resolve(config, mixed, model, 1)
    assert single.device_name == h100s.gpus[0].name and not any("differ" in n for n in single.notes)


@pytest.mark.slow
def test_two_processes_equal_one_with_twice_the_accumulation(make_config, tmp_path):
    """GPUS=2 through the real torchrun (gloo): the same final weights as one process with accumulation x2.
    Rank 1 alone runs out of memory at step 2: both ranks agree, halve and redo the step."""
    common = "CONFIG_MAX_STEPS=6\nCONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\nCONFIG_LOG_INTERVAL=1\n"
    two = make_config(manual(16, 1, common))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME")}
    env.update({"KCONFIG_CONFIG": str(two.source), "GPUS": "2", "KFIT_INJECT_OOM": "2",
                "KFIT_INJECT_OOM_RANK": "1"})
    result = subprocess.run([sys.executable, str(SCRIPT), "train"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Launching 2 training processes" in result.stdout and "over 2 processes" in result.stdout
    # rank 0 reports; it did not run out of memory itself but redid the step with rank 1
    assert "Out of memory at step 2 (another rank ran out of memory)" in result.stdout
    assert "Done: 6 steps" in result.stdout
    assert result.stdout.count("Done:") == 1  # only rank 0 reports
    [final] = (tmp_path / "runs").glob(f"*/{FINAL}")
    state = load_checkpoint(final)
    assert state["plan"]["world_size"] == 2 and state["progress"]["micro_batch"] == 8

    single, _ = run(make_config(manual(16, 2, common)))
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value, atol=1e-5, rtol=1e-4, msg=name)


def _kfit(cwd: Path, config: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME", "GPUS",
                                                             "GPU", "HW", "FREE_GB", "FORMAT", "NNODES")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**base, "KCONFIG_CONFIG": str(config), "OMP_NUM_THREADS": "1", **env})


def test_gpus_means_processes_when_planning_a_simulated_machine(tmp_path, kfit_here):
    (tmp_path / "target").write_text("CONFIG_TARGET_EFFECTIVE_BATCH=1024\n")
    from lib import config as kc

    config = kc.make_defconfig("lenet5", [str(tmp_path / "target")], out=tmp_path / ".config")
    result = kfit_here(tmp_path, "plan", KCONFIG_CONFIG=config.source, GPU="b200", GPUS="4", FORMAT="json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 4 and plan["effective_batch"] == 1024
    assert plan["micro_batch"] * plan["grad_accum"] * 4 == 1024 and len(plan["hardware"]["gpus"]) == 4


@pytest.mark.slow
def test_the_plan_previewed_with_gpus_is_the_plan_that_trains(make_config, tmp_path, kfit_here):
    config = make_config("CONFIG_MAX_STEPS=2\nCONFIG_TARGET_EFFECTIVE_BATCH=64\n")
    # `kfit plan` in this process (the preview's output), then `kfit train` as make runs it: torchrun's ranks
    previewed = kfit_here(tmp_path, "plan", KCONFIG_CONFIG=config.source, GPUS="2", FORMAT="json")
    assert previewed.returncode == 0, previewed.stderr
    plan = json.loads(previewed.stdout)
    resolves = tmp_path / "resolves.log"
    trained = _kfit(tmp_path, Path(config.source), "train", GPUS="2", **counting_resolves(resolves))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    # one resolve in the launcher, none in the two ranks: they train the plan it hands them
    [launcher] = resolves.read_text().splitlines()
    assert launcher.endswith(" lenet5 world_size=2") and "re-planning" not in trained.stdout
    [line] = [x for x in trained.stdout.splitlines() if x.startswith("Hyperparams:")]
    assert plan["world_size"] == 2
    assert (f"batch={plan['micro_batch']}, grad_acc={plan['grad_accum']} (effective={plan['effective_batch']}, "
            in line), (plan, line)


@pytest.mark.slow
def test_one_process_train_resolves_its_plan_once(make_config, tmp_path):
    config = make_config("CONFIG_MAX_STEPS=1\nCONFIG_TARGET_EFFECTIVE_BATCH=64\n")
    resolves = tmp_path / "resolves.log"
    trained = _kfit(tmp_path, Path(config.source), "train", **counting_resolves(resolves))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    [line] = resolves.read_text().splitlines()
    assert line.endswith(" lenet5 world_size=1") and "Done: 1 steps" in trained.stdout


@pytest.mark.slow
def test_torchrun_of_one_process_started_by_hand_plans_in_its_rank(make_config, tmp_path):
    config = make_config("CONFIG_MAX_STEPS=1\nCONFIG_TARGET_EFFECTIVE_BATCH=32\n")
    trained = _kfit(tmp_path, Path(config.source), "train", TORCHELASTIC_RUN_ID="by-hand", RANK="0", LOCAL_RANK="0",
                    WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "no plan from a kfit launcher" in trained.stdout and "Done: 1 steps" in trained.stdout


def test_a_rank_trains_the_plan_and_config_its_launcher_hands_it(make_config, tmp_path, monkeypatch):
    """A rank reads the launcher's plan and config (the launch file, overrides applied) instead of resolving or
    reading .config; a damaged file is one clear error, and a world size the launcher did not plan for (an
    elastic restart) is re-planned, said."""
    from lib import config as kc
    from lib.cli.invocation import Invocation
    from lib.cli.train import _handed_plan, handed_launch

    config = kc.derive(make_config("CONFIG_TARGET_EFFECTIVE_BATCH=64\n"), {"MAX_STEPS": "3"})
    model = ModelDescription.from_config(config)
    plan = resolve(config, CPU, model, 2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plan": plan.to_dict(), "config": config.text, "source": config.source}))
    handed_config, handed_plan = handed_launch(str(path))
    assert handed_config == config and handed_config.max_steps == 3 and handed_plan == plan
    lines = []
    run = Invocation()
    assert _handed_plan(config, CPU, run, 2, lines.append, plan=plan) == (model, plan)
    assert lines == []
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _, replanned = _handed_plan(config, CPU, run, 4, lines.append, plan=plan)
    assert replanned.world_size == 4 and "re-planning for 4 (an elastic restart)" in lines[0]
    for damaged in ("[]", json.dumps(plan.to_dict()), json.dumps({"plan": plan.to_dict(), "config": 1})):
        path.write_text(damaged)
        with pytest.raises(KfitError, match="--launch .*the launcher's plan cannot be read"):
            handed_launch(str(path))


# --------------------------------------------------------------------------
# torchrun's own output (issue 16, defect 13b): a stopped run is 143 with the ranks' one line, a killed rank
# one error line naming it; torchrun's 40-50 lines of traceback go to its log

TORCHRUN_PID = 24462
_FRAMES = '''Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
'''
KILLED_RANK = f'''W1123 03:22:24.396000 {TORCHRUN_PID} torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 24490 closing signal SIGTERM
E1123 03:22:24.436000 {TORCHRUN_PID} torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 24491) of binary: /venv/bin/python
{_FRAMES}torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
=======================================================
/work/main/scripts/kfit.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_03:22:24
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24490)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 24490
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_03:22:24
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 24491)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 24491
=======================================================
'''
STOPPED = f'''W1123 03:20:53.440000 {TORCHRUN_PID} torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1123 03:20:53.441000 24890 torch/some/rank.py:1] a rank's own warning
{_FRAMES}torch.distributed.elastic.multiprocessing.api.SignalException: Process {TORCHRUN_PID} got signal: 15
'''
RANK_TRACEBACK = '''Traceback (most recent call last):
  File "/work/main/scripts/kfit.py", line 191, in <module>
    sys.exit(main())
ZeroDivisionError: division by zero
'''


def _read(text: str) -> tuple[torchrun_output.TorchrunOutput, str]:
    import io

    out = io.StringIO()
    output = torchrun_output.TorchrunOutput(TORCHRUN_PID, out)
    for line in text.splitlines(True):
        output.feed(line)
    output.close(None)
    return output, out.getvalue()


def test_torchrun_output_keeps_its_own_lines_and_reads_the_root_cause(tmp_path, capsys):
    output, shown = _read(KILLED_RANK + "error: a rank's own error line\n")
    assert shown == "error: a rank's own error line\n"
    assert "".join(output.kept) == KILLED_RANK and output.root == {"rank": 3, "local_rank": 1, "exitcode": -9}
    log = tmp_path / "runs" / "torchrun.log"
    assert torchrun_output.explain(output, 1, log) == 137
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: training process rank 3 (local rank 1) was killed by signal 9 (SIGKILL)")
    assert f"torchrun's report: {log}" in line
    output.close(log)
    assert log.read_text() == KILLED_RANK

    output, shown = _read(STOPPED)
    assert output.signal == 15 and output.root == {} and output.failure is None
    assert shown == "W1123 03:20:53.441000 24890 torch/some/rank.py:1] a rank's own warning\n"

    output, shown = _read(RANK_TRACEBACK)  # a rank's traceback is a bug to show, not torchrun's noise
    assert shown == RANK_TRACEBACK and output.kept == []

    # a surviving rank's collective fails once its peer is killed: its traceback is the kill's consequence
    collateral = "".join(f"[rank0]: {line}" for line in
                         ["Traceback (most recent call last):\n", '  File "lib/distributed.py", line 357, in all_sum\n',
                          "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer\n"])
    output, shown = _read(collateral + KILLED_RANK)
    assert shown == "" and collateral in "".join(output.kept)
    output, shown = _read(collateral)  # no rank was killed: the rank's own exception is shown
    assert shown == collateral


def _train_and_stop(tmp_path, make_config, stop) -> tuple[subprocess.CompletedProcess, int]:
    """`kfit train` with GPUS=2 (gloo) until step 3, then `stop(launcher, ranks)`; the result and the launcher's
    pid."""
    import psutil

    config = make_config("CONFIG_EPOCHS=1000\nCONFIG_LOG_INTERVAL=1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME", "NNODES")}
    env.update(KCONFIG_CONFIG=str(config.source), GPUS="2")
    process = subprocess.Popen([sys.executable, str(SCRIPT), "train"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    for line in process.stdout:
        if line.startswith("step ") and " 3/" in line:
            break
    launcher = psutil.Process(process.pid)
    ranks = [p for p in launcher.children(recursive=True) if str(SCRIPT) in p.cmdline() and "-u" in p.cmdline()]
    assert len(ranks) == 2, [p.cmdline() for p in launcher.children(recursive=True)]
    stop(process, ranks)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), process.pid


@pytest.mark.slow
def test_a_group_sigterm_under_torchrun_exits_143_in_one_line(tmp_path, make_config):
    import signal

    result, launcher = _train_and_stop(tmp_path, make_config, lambda p, ranks: os.killpg(p.pid, signal.SIGTERM))
    err = result.stderr
    assert result.returncode == 143, err
    assert "Traceback" not in err and "SignalException" not in err and "death signal" not in err, err
    assert [line for line in result.stdout.splitlines() if "SIGTERM" in line] == [
        next(line for line in result.stdout.splitlines() if line.startswith("SIGTERM received: checkpoint saved"))]
    log = Path(tempfile.gettempdir()) / f"kfit-torchrun-{launcher}.log"
    assert "Received 15 death signal" in log.read_text()
    log.unlink()


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_is_one_error_line_naming_it(tmp_path, make_config):
    import signal

    result, _ = _train_and_stop(tmp_path, make_config, lambda p, ranks: ranks[1].send_signal(signal.SIGKILL))
    err = result.stderr
    assert result.returncode == 137, err
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    [line] = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("error: training process rank ") and "was killed by signal 9 (SIGKILL)" in line
    log = Path(line.split("torchrun's report: ")[1].split(";")[0])
    assert log.name.startswith("kfit-torchrun-") and "Root Cause" in log.read_text()
    assert list((tmp_path / "runs").iterdir()) == [next((tmp_path / "runs").iterdir())]  # the run directory only
    log.unlink()


def test_the_launcher_never_hands_the_ranks_zero_threads():
    """OMP_NUM_THREADS=0 is no count (lib.threads ignores it): the ranks get the launcher's decision instead."""
    for given in ("0", "-2", ""):
        assert distributed._with_threads(2, {"OMP_NUM_THREADS": given}, 3)["OMP_NUM_THREADS"] == "3"
    assert distributed._with_threads(2, {"OMP_NUM_THREADS": "5"}, 3)["OMP_NUM_THREADS"] == "5"  # the user's stays


def test_the_store_warning_of_a_finished_multi_node_run_goes_to_the_log():
    dump = ("[W1124 11:49:25.708396638 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3): "
            "Failed to recv, got 0 bytes. Connection was likely closed.\n"
            "Exception raised from recvBytes at torch/csrc/distributed/c10d/Utils.hpp:787 (most recent call first):\n"
            "frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f in libc10.so)\n"
            "<omitting python frames>\n"
            "frame #34: _start + 0x21 (0x55 in python)\n")
    output, shown = _read(dump + "a rank's line\n")
    assert shown == "a rank's line\n" and "".join(output.kept) == dump


@pytest.mark.slow  # torchrun with two processes, twice
@pytest.mark.parametrize("how", ["set", "make"])
def test_command_line_overrides_reach_every_rank(make_config, tmp_path, how):
    """`make train GPUS=2 MAX_STEPS=5` printed the override and trained the config's 120 steps: each rank read
    .config again and dropped the overrides. The launcher now hands them the config it planned from."""
    config = make_config("CONFIG_TARGET_EFFECTIVE_BATCH=64\nCONFIG_EPOCHS=40\n")
    runs = tmp_path / "elsewhere"
    if how == "set":
        trained = _kfit(tmp_path, Path(config.source), "train", "--gpus", "2", "--set", "MAX_STEPS=3",
                        "--set", f"OUTPUT_DIR={runs}")
    else:  # make's command line, as the Makefile hands it over
        trained = _kfit(tmp_path, Path(config.source), "train", GPUS="2",
                        KFIT_OVERRIDES=f"OUTPUT_DIR={runs} MAX_STEPS=3")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "Done: 3 steps" in trained.stdout, trained.stdout
    [run] = [p for p in runs.iterdir() if p.is_dir()]
    recorded = (run / "config").read_text().splitlines()
    assert "CONFIG_MAX_STEPS=3" in recorded and f'CONFIG_OUTPUT_DIR="{runs}"' in recorded
