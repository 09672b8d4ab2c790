"""The Optuna search: trials train the real model under the plan, prune, fail alone, resume, and apply."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch

from lib import config as kc
from lib import hpo
from lib.hardware import resolve_hardware
from lib.task import load_task

ROOT = Path(__file__).resolve().parent.parent
CPU = resolve_hardware(gpu="cpu")
State = optuna.trial.TrialState
GOOD = {"optimizer": "adamw", "learning_rate": 3e-3, "weight_decay": 1e-4, "effective_batch": 128}
pytestmark = pytest.mark.filterwarnings("ignore:Fixed parameter learning_rate:UserWarning")  # enqueued on purpose
HOPELESS = {"optimizer": "sgd", "learning_rate": 1e-4, "weight_decay": 1e-6, "effective_batch": 32}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # 2 shared cores: two intra-op threads spin against other jobs (measured 15x slower); see test_lr_finder.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study_config(tmp_path_factory):
    """lenet5, 3 epochs a trial. Reduction factor 4 over 1..3 epochs gives Hyperband one bracket with a
    rung after epoch 1, so a trial that is worse there than an earlier one is pruned, deterministically.
    The tiers policy on a CPU profile caps LeNet's micro-batch at 64 (16 x model scale 4)."""
    tmp = tmp_path_factory.mktemp("hpo")
    fragment = tmp / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_POLICY_TIERS=y\n'
                        'CONFIG_HPO_MIN_RESOURCE=1\nCONFIG_HPO_MAX_RESOURCE=3\nCONFIG_HPO_REDUCTION_FACTOR=4\n'
                        'CONFIG_HPO_PATIENCE=0\nCONFIG_HPO_BATCH_SIZES="32 64 128"\nCONFIG_HPO_STUDY_NAME="test"\n')
    return kc.make_defconfig("lenet5", [str(fragment)], out=tmp / "config")


@pytest.fixture(scope="module")
def first_run(study_config):
    study = hpo.open_study(study_config)
    study.enqueue_trial(GOOD)
    study.enqueue_trial(HOPELESS)
    # Far past where SGD is stable (and outside the search range: Optuna runs an enqueued value anyway):
    # the loss overflows, train() raises FloatingPointError.
    study.enqueue_trial({**GOOD, "optimizer": "sgd", "learning_rate": 1e6})
    lines: list[str] = []
    study = hpo.run_study(study_config, CPU, trials=3, task=load_task(study_config), log=lines.append)
    return study, lines


def test_trials_run_prune_and_fail_without_ending_the_study(first_run):
    study, lines = first_run
    good, hopeless, broken = study.get_trials()
    assert good.state == State.COMPLETE and good.value < 1.0 and good.user_attrs["accuracy"] > 0.7
    assert sorted(good.intermediate_values) == [1, 2, 3]  # one report per epoch
    assert hopeless.state == State.PRUNED and hopeless.last_step == 1  # worse than `good` at the first rung
    assert broken.state == State.FAIL
    assert any("trial 1 pruned" in line and "at epoch 1" in line for line in lines)
    assert any("trial 2 fail" in line and "loss became" in line for line in lines)
    assert Path(good.user_attrs["run_dir"], "checkpoint.pt").is_file()  # each trial has its own run directory


def test_a_sampled_batch_above_the_cap_runs_with_accumulation(first_run):
    study, _ = first_run
    good = study.trials[0]
    assert good.params["effective_batch"] == 128
    assert (good.user_attrs["micro_batch"], good.user_attrs["grad_accum"]) == (64, 2)
    assert good.user_attrs["effective_batch"] == 128
    assert good.user_attrs["eval_batch"] == 128  # evaluation at the largest safe batch (2 x the cap)
    plan = (Path(good.user_attrs["run_dir"]) / "plan.json").read_text()
    assert '"micro_batch": 64' in plan and '"grad_accum": 2' in plan


def test_a_second_invocation_continues_the_study_from_sqlite(first_run, study_config):
    study, _ = first_run
    before = [(t.number, t.state, t.value, t.params) for t in study.trials]
    assert Path(study_config.output_dir, "hpo-test", "study.db").is_file()
    again = hpo.run_study(study_config, CPU, trials=1, task=load_task(study_config), log=lambda line: None)
    after = again.trials
    assert len(after) == 4
    assert [(t.number, t.state, t.value, t.params) for t in after[:3]] == before
    assert after[3].params != after[0].params  # a fresh sample, not a replay of the first invocation's draws
    status = "\n".join(hpo.status_lines(hpo.open_study(study_config, create=False), "db"))
    assert "4 trials:" in status and "1 failed" in status and "best: trial" in status
    assert "plan: micro-batch" in status


def test_best_parameters_are_applied_to_the_config_and_validated(first_run, study_config, tmp_path):
    study, _ = first_run
    path = tmp_path / ".config"
    path.write_text(Path(study_config.source).read_text())
    kc.apply_assignments(path, {"HYPER_PARAM_MANUAL": True})  # hpo-apply also switches MANUAL back to AUTO
    best = hpo.best_trial(study)
    config = kc.apply_assignments(path, hpo.best_assignments(study))
    assert kc.read_config(path) == config
    assert config.hyperparam_mode == "auto"
    assert config.learning_rate == pytest.approx(best.params["learning_rate"], rel=1e-5)
    assert config.weight_decay == pytest.approx(best.params["weight_decay"], rel=1e-5)
    assert config.optimizer == best.params["optimizer"]
    assert config.target_effective_batch == best.params["effective_batch"]


def test_cli_status_apply_and_new_defconfig(first_run, study_config, tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import kfit

    monkeypatch.setattr(kfit.signal, "signal", lambda *args: None)  # main() would reset SIGPIPE for pytest

    path = tmp_path / ".config"
    path.write_text(Path(study_config.source).read_text())
    monkeypatch.setenv("KCONFIG_CONFIG", str(path))
    monkeypatch.delenv("HPO_STORAGE", raising=False)
    assert kfit.main(["hpo-status"]) == 0
    assert "Study 'test'" in capsys.readouterr().out
    out = tmp_path / "tuned"
    monkeypatch.setenv("DEFCONFIG", str(out))
    assert kfit.main(["hpo-apply"]) == 0
    assert path.read_text() == Path(study_config.source).read_text()  # DEFCONFIG= leaves .config alone
    best = hpo.best_trial(first_run[0])
    assert kc.make_defconfig(str(out), out=tmp_path / "from-defconfig").optimizer == best.params["optimizer"]
    assert kfit.main(["hpo-apply"]) == 2  # refuses to overwrite
    monkeypatch.delenv("DEFCONFIG")
    assert kfit.main(["hpo-apply"]) == 0
    assert kc.read_config(path).target_effective_batch == best.params["effective_batch"]
    monkeypatch.setenv("KCONFIG_CONFIG", str(tmp_path / "other"))
    (tmp_path / "other").write_text(path.read_text().replace('HPO_STUDY_NAME="test"', 'HPO_STUDY_NAME="none"'))
    assert kfit.main(["hpo-status"]) == 2
    assert "no study 'none'" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_patience_prunes_a_stalled_trial_even_when_hyperband_would_not(study_config):
    """Optuna's PatientPruner(Hyperband) needs both to agree; CONFIG_HPO_PATIENCE means either."""
    config = kc.derive(study_config, {"HPO_PATIENCE": 1})
    study = optuna.create_study(pruner=hpo.make_pruner(config), direction="minimize")
    trial = study.ask()
    for epoch, loss in ((1, 1.0), (2, 1.1), (3, 1.2)):  # the only trial: Hyperband keeps it
        trial.report(loss, epoch)
    assert trial.should_prune()
    wrapped = optuna.create_study(pruner=optuna.pruners.PatientPruner(
        hpo.make_pruner(kc.derive(config, {"HPO_PATIENCE": 0})), 1), direction="minimize")
    trial = wrapped.ask()
    for epoch, loss in ((1, 1.0), (2, 1.1), (3, 1.2)):
        trial.report(loss, epoch)
    assert not trial.should_prune()


@pytest.mark.slow  # two processes through make
def test_two_make_hpo_workers_share_one_study_through_hpo_storage(study_config, tmp_path):
    """Started together on a new database, as a cluster job array would: both create the study."""
    config = tmp_path / "config"
    config.write_text(Path(study_config.source).read_text())
    kc.apply_assignments(config, {"HPO_STUDY_NAME": "shared", "HPO_MAX_RESOURCE": 1})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k not in
           ("TRIALS", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE")}
    env.update(KCONFIG_CONFIG=str(config), HPO_STORAGE=f"sqlite:///{tmp_path}/shared.db", TRIALS="1",
               OMP_NUM_THREADS="1")
    workers = [subprocess.Popen(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "hpo"], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for _ in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(outputs)
    study = optuna.load_study(study_name="shared", storage=env["HPO_STORAGE"])
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == [0, 1]
    assert trials[0].params != trials[1].params  # the workers drew different trials
    assert all(t.state == State.COMPLETE for t in trials)
    assert not (tmp_path / "runs" / "hpo-shared" / "study.db").exists()  # the URL replaced the default file
