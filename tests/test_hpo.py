"""The Optuna search: trials train the real model under the plan, prune, fail alone, resume, and apply."""

from __future__ import annotations

import os
import signal
import sqlite3
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
PASSWORD = "s3cretPW"
SERVER_URL = f"postgresql://user:{PASSWORD}@127.0.0.1:1/db"  # nothing listens on port 1; psycopg is not installed


def make_env(**extra) -> dict:
    """The environment make gives kfit: the developer's, less what a command line would carry, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k not in
           ("TRIALS", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "HPO_STORAGE", "HPO_STUDY", "DEFCONFIG")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def kfit_cli(command: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    """`python scripts/kfit.py <command>` as make runs it, stdout and stderr together."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "kfit.py"), command], cwd=cwd, env=make_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def assert_refused(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2 with one `error:` line naming the needles, no traceback."""
    out = result.stdout
    assert result.returncode == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    for needle in needles:
        assert needle in errors[0], out


@pytest.fixture
def config_copy(study_config, tmp_path) -> Path:
    path = tmp_path / ".config"
    path.write_text(Path(study_config.source).read_text())
    return path


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
    env = make_env(KCONFIG_CONFIG=str(config), HPO_STORAGE=f"sqlite:///{tmp_path}/shared.db", TRIALS="1")
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


@pytest.mark.slow  # two kfit processes refused
def test_storage_passwords_are_redacted_everywhere(study_config, config_copy, tmp_path):
    """The start line, the error and hpo-status show user:***@host; the trial directory's name hides it too."""
    for command in ("hpo", "hpo-status"):
        result = kfit_cli(command, tmp_path, KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=SERVER_URL)
        assert_refused(result, "HPO_STORAGE=postgresql://user:***@127.0.0.1:1/db")
        assert PASSWORD not in result.stdout
    assert hpo.redact("a p@ss:w/rd: postgresql+psycopg2://me:p@ss:w/rd@db-host:5432/optuna?x=1") == \
        "a p@ss:w/rd: postgresql+psycopg2://me:***@db-host:5432/optuna?x=1"
    assert hpo.redact("sqlite:////abs/study.db") == "sqlite:////abs/study.db"
    other = SERVER_URL.replace(PASSWORD, "other")
    assert hpo.study_dir(study_config, SERVER_URL) == hpo.study_dir(study_config, other)  # one database
    assert PASSWORD not in str(hpo.study_dir(study_config, SERVER_URL))
    study = optuna.create_study()
    assert PASSWORD not in "\n".join(hpo.status_lines(study, SERVER_URL))


@pytest.mark.slow  # a kfit process each
@pytest.mark.parametrize("url, needle", [
    ("notaurl", "not a database URL"),
    (SERVER_URL, "HPO_STORAGE=postgresql://user:***@127.0.0.1:1/db"),  # no driver (or, with one, no server)
    ("sqlite:////nonexistent/x.db", "/nonexistent"),
])
def test_a_bad_hpo_storage_is_one_error_line(config_copy, tmp_path, url, needle):
    """Through make hpo; hpo-status's rows are in tests/test_bad_input.py."""
    before = sorted(tmp_path.rglob("*"))
    assert_refused(kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=url), "HPO_STORAGE=", needle)
    assert sorted(tmp_path.rglob("*")) == before  # no database file, no study directory


def _stored_trial(study: optuna.Study, config, value: float, **params) -> None:
    """A finished trial of the config's search space, stored without training."""
    params = {**GOOD, **params}
    space = hpo.search_space(config)
    study.add_trial(optuna.trial.create_trial(params=params, distributions={k: space[k] for k in params},
                                              value=value))


def test_a_changed_search_space_is_refused_before_any_trial(study_config, config_copy, tmp_path):
    url = f"sqlite:///{tmp_path}/space.db"
    study = hpo.open_study(study_config, url)
    _stored_trial(study, study_config, 0.5)
    db = (tmp_path / "space.db").read_bytes()
    kc.apply_assignments(config_copy, {"HPO_BATCH_SIZES": "16 64"})
    result = kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=url, TRIALS="1")
    assert_refused(result, "effective_batch", '"32 64 128"', '"16 64"', "CONFIG_HPO_BATCH_SIZES", "HPO_STUDY=")
    assert len(optuna.load_study(study_name="test", storage=url).trials) == 1  # no failed trial recorded
    assert (tmp_path / "space.db").read_bytes() == db
    hpo.check_space(study, kc.derive(study_config, {"HPO_LR_MAX": "0.5"}), url)  # a range may change
    with pytest.raises(hpo.KfitError, match="optimizer"):
        hpo.check_space(study, kc.derive(study_config, {"HPO_OPTIMIZER_SGD": False}), url)


def test_a_study_of_the_same_name_in_another_storage_keeps_to_its_own_directories(first_run, study_config,
                                                                                   config_copy, tmp_path):
    first = Path(first_run[0].trials[0].user_attrs["run_dir"])
    files = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    url = f"sqlite:///{tmp_path}/other.db"
    kc.apply_assignments(config_copy, {"HPO_MAX_RESOURCE": 1})
    result = kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=url, TRIALS="1")
    assert result.returncode == 0, result.stdout
    other = Path(optuna.load_study(study_name="test", storage=url).trials[0].user_attrs["run_dir"])
    assert other.name == first.name == "trial-0000" and other.parent != first.parent
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == files  # the first study's trial 0
    (tmp_path / "d" / "trial-0003").mkdir(parents=True)
    (tmp_path / "d" / "trial-0003" / "keep").write_text("an earlier study's")
    assert hpo.new_trial_dir(tmp_path / "d", 3).name == "trial-0003-2"  # never an existing directory
    assert (tmp_path / "d" / "trial-0003" / "keep").read_text() == "an earlier study's"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_status_fails_the_trial_of_a_killed_worker_after_the_grace_period(study_config, config_copy, tmp_path):
    """README: a killed worker's trial is marked failed after 5 minutes, not shown running forever."""
    url = f"sqlite:///{tmp_path}/killed.db"
    study = hpo.open_study(study_config, url)
    killed, alive = study.ask(), study.ask()
    for trial in (killed, alive):
        study._storage.record_heartbeat(trial._trial_id)  # as the worker's heartbeat thread does
    with sqlite3.connect(tmp_path / "killed.db") as db:  # the killed worker's last heartbeat: 20 minutes ago
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, '-20 minutes') WHERE trial_id = ?",
                   (killed._trial_id,))
    result = kfit_cli("hpo-status", tmp_path, KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=url)
    assert result.returncode == 0, result.stdout
    assert "2 trials: 0 complete, 0 pruned, 1 failed, 1 running" in result.stdout
    assert f"trial(s) {killed.number}: no heartbeat for over 5 minutes" in result.stdout
    assert hpo.HEARTBEAT_GRACE_S == 300


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_search_says_what_it_kept(study_config, config_copy, tmp_path, signum, code):
    url = f"sqlite:///{tmp_path}/stop.db"
    _stored_trial(hpo.open_study(study_config, url), study_config, 0.5)
    kc.apply_assignments(config_copy, {"HPO_MAX_RESOURCE": 200})  # a trial far longer than the test waits
    # SIGINT as from a terminal: a child inherits an ignored SIGINT (as pytest-xdist's workers may have it) and
    # ignores it until the trainer installs its own handler, so on a loaded machine the signal could be lost
    worker = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "kfit.py"), "hpo"], cwd=tmp_path,
                              env=make_env(KCONFIG_CONFIG=str(config_copy), HPO_STORAGE=url, TRIALS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = ""
    while not out.endswith(", eval batch 128\n"):  # trial 1 is training
        line = worker.stdout.readline()
        assert line, out
        out += line
    worker.send_signal(signum)
    out += worker.communicate(timeout=120)[0]
    assert worker.returncode == code and "Traceback" not in out, out
    assert out.splitlines()[-1] == (f"interrupted: study 'test' keeps its 1 complete and 0 pruned trial(s) in {url} "
                                    "(a trial cut short is recorded as failed); 'make hpo' continues it")
    kept, stopped = optuna.load_study(study_name="test", storage=url).trials
    assert kept.state == State.COMPLETE and stopped.state == State.FAIL
    assert signal.Signals(signum).name in stopped.user_attrs["error"]


def test_hpo_apply_prints_exactly_what_it_writes(first_run, config_copy, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import kfit

    monkeypatch.setattr(kfit.signal, "signal", lambda *args: None)
    monkeypatch.setenv("KCONFIG_CONFIG", str(config_copy))
    for name in ("HPO_STORAGE", "HPO_STUDY", "DEFCONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert kfit.main(["hpo-apply"]) == 0
    shown = capsys.readouterr().out.split("# ", 1)[1].split(" written to ")[0].split(", ")
    written = config_copy.read_text().splitlines()
    assert all(line in written for line in shown), (shown, written)
    assert any(line.startswith("CONFIG_LEARNING_RATE=") for line in shown)


def test_status_and_apply_never_create_a_config(first_run, tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import kfit

    monkeypatch.setattr(kfit.signal, "signal", lambda *args: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KCONFIG_CONFIG", raising=False)
    for command in ("hpo-status", "hpo-apply"):
        assert kfit.main([command]) == 2
        assert ".config: no such file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_probe_runs_once_before_the_trials_and_caps_them(tmp_path, monkeypatch):
    """A device that holds 16 samples (injected): the probe finds it once, and the trials, planned at 64 by the
    tiers policy, run 16 x 4 from the start instead of each running out of memory first."""
    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_POLICY_TIERS=y\n'
                        'CONFIG_PROBE_ALWAYS=y\nCONFIG_HPO_MIN_RESOURCE=1\nCONFIG_HPO_MAX_RESOURCE=1\n'
                        'CONFIG_HPO_BATCH_SIZES="32 64"\nCONFIG_HPO_STUDY_NAME="probed"\n')
    config = kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / "config")
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "16")
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "cache"))  # the probe's cache: this test's own
    hpo.open_study(config).enqueue_trial({**GOOD, "effective_batch": 64})
    lines: list[str] = []
    study = hpo.run_study(config, CPU, trials=1, task=load_task(config), log=lines.append)
    [trial] = study.get_trials()
    assert trial.state == State.COMPLETE
    assert (trial.user_attrs["micro_batch"], trial.user_attrs["grad_accum"]) == (16, 4)
    assert [line for line in lines if "every trial's micro-batch at most 16" in line] != []
    metrics = (Path(trial.user_attrs["run_dir"]) / "metrics.jsonl").read_text()
    assert "oom_recovery" not in metrics  # capped before the first step, not recovered during it


# --------------------------------------------------------------------------
# Robustness (issue 32): a storage locked during a trial; every password form redacted


@pytest.mark.parametrize("held_s, wait_s", [
    (1.2, 1.0),  # released while Optuna marks the trial: its own cleanup records FAIL
    (2.6, 1.0),  # held past Optuna's cleanup too (its UnboundLocalError): kfit's retry records FAIL
])
def test_a_storage_locked_during_a_trial_is_one_error_and_the_trial_fails(study_config, tmp_path, monkeypatch,
                                                                         held_s, wait_s):
    import threading

    from lib import trainer
    from lib.errors import KfitError

    monkeypatch.setattr(hpo.storage, "LOCK_WAIT_S", wait_s)
    db = tmp_path / "locked.db"
    url = f"sqlite:///{db}"
    hpo.open_study(study_config, url).enqueue_trial(GOOD)

    def locked_train(cfg, plan, hardware, *, on_eval, **kwargs):
        other = sqlite3.connect(db, timeout=0, check_same_thread=False)  # another worker's long write
        other.execute("BEGIN EXCLUSIVE")
        threading.Timer(held_s, lambda: (other.rollback(), other.close())).start()
        on_eval(1, 1, {"eval_loss": 1.0})  # trial.report: the storage is locked
        raise AssertionError("the report went through a locked storage")

    monkeypatch.setattr(trainer, "train", locked_train)
    with pytest.raises(KfitError) as refused:
        hpo.run_study(study_config, CPU, trials=1, storage=url, task=load_task(study_config), log=lambda line: None)
    message = str(refused.value)
    assert "\n" not in message and "database is locked" in message and "trial 0 is marked failed" in message
    assert f"waited up to {wait_s:g}s" in message and f"HPO_STORAGE={url}" in message
    [trial] = optuna.load_study(study_name="test", storage=url).trials
    assert trial.state == State.FAIL


REDACT_URLS = [
    "postgresql://user:s3cretPW@host:5432/db",
    "postgresql://user@host/db?password=s3cretPW",
    "postgresql://user@host/db?sslmode=require&password=s3cretPW&x=1",
    "postgresql://user:my secret pw@host/db",  # a space
    "postgresql://user:p%40ss%20word%2F1@host/db",  # percent-encoded
    "mysql+pymysql://user@host/db?passwd=s3cretPW",
    "postgresql://user@host/db?sslpassword=s3cretPW&password=0therPW1",
    "postgresql://my user:s3cretPW@host/db",  # a space in the user name
]


@pytest.mark.parametrize("url", REDACT_URLS)
def test_every_password_form_is_redacted_as_sqlalchemy_parses_it(url):
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    secrets = [parsed.password] if parsed.password else []
    secrets += [v for k, v in parsed.query.items() if "pass" in k]
    assert secrets and all(secrets)
    for text in (url, f"HPO_STORAGE={url}: cannot open the database (x): check the host", f"in {url} (1 trial)"):
        shown = hpo.redact(text)
        for secret in secrets:
            assert secret not in shown, (text, shown)
        assert "***" in shown
    assert not make_url(hpo.redact(url)).password or make_url(hpo.redact(url)).password == "***"
    redacted = make_url(hpo.redact(url))
    assert (redacted.drivername, redacted.host, redacted.database) == (parsed.drivername, parsed.host,
                                                                          parsed.database)


def test_redaction_leaves_urls_without_secrets_alone():
    for text in ("sqlite:////abs/study.db", "postgresql://user@host:5432/db?sslmode=require", "no url here"):
        assert hpo.redact(text) == text


@pytest.mark.parametrize("url", ["user:S3CRETPW/x@127.0.0.1:9/db", "//user:S3CRETPW@h/db", "user:S3CRETPW x@h/db",
                                 "user:S3CRETPW@127.0.0.1:9/db"])
def test_a_storage_that_is_not_a_database_url_is_refused_without_showing_it(url):
    """HPO_STORAGE without a scheme: no parser finds its password to hide, so make hpo-status and make sbatch
    ARRAY= printed it (an audit); it is one error line that never shows the value."""
    from lib import hpo
    from lib.errors import KfitError

    with pytest.raises(KfitError, match=r"HPO_STORAGE=\(not shown.*is not a database URL") as err:
        hpo.checked_storage(url)
    assert "S3CRETPW" not in str(err.value)
    assert "S3CRETPW" not in hpo.redact("in https://S3CRETPW@h/db", "https://S3CRETPW@h/db")  # a lone token
