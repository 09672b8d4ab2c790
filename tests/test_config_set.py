"""make config-set / kfit config-set: NAME=VALUE settings written into the config, each checked as strictly as a
fragment; a value that does not take is one error line naming it, and the config stays byte-identical."""

import subprocess
from pathlib import Path

import pytest

from lib import config as kc

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def kfit(tmp_path, kfit_here):
    """kfit's command in this process (conftest's kfit_here), in tmp_path, on a lenet5 .config there."""
    kc.make_defconfig("lenet5", out=tmp_path / ".config")
    return lambda *args, **env: kfit_here(tmp_path, *args, **env)


def test_writes_each_setting_through_the_strict_reader(kfit, tmp_path):
    before = (tmp_path / ".config").read_bytes()
    run = kfit("config-set", "EPOCHS=3", "CONFIG_LEARNING_RATE=0.01", "--set", "PRECISION=BF16")
    assert run.returncode == 0, run.stderr
    config = kc.read_config(tmp_path / ".config")
    assert (config.epochs, config.learning_rate, config.precision) == (3, 0.01, "bf16")
    assert (tmp_path / ".config.old").read_bytes() == before  # as the kernel keeps it
    assert "CONFIG_EPOCHS=3" in run.stdout and "CONFIG_PRECISION_BF16=y" in run.stdout


def test_a_choice_and_what_depends_on_it_in_one_command(kfit, tmp_path):
    run = kfit("config-set", "HYPER_PARAM_MANUAL=y", "BATCH_SIZE=4")
    assert run.returncode == 0, run.stderr
    config = kc.read_config(tmp_path / ".config")
    assert (config.hyperparam_mode, config.batch_size) == ("manual", 4)
    assert "/tmp" not in run.stdout.replace(str(tmp_path), "")  # notes name the config, not temporary files


@pytest.mark.parametrize("words, named", [
    (["EPOCHS=4", "LEARNING_RATE=abc"], "CONFIG_LEARNING_RATE"),  # the first one took; nothing is written
    (["EPOCHS=0"], "CONFIG_EPOCHS=0"),  # out of range
    (["BATCH_SIZE=4"], "CONFIG_BATCH_SIZE=4"),  # its dependencies are not met in AUTO mode
    (["EPOCHZ=3"], "EPOCHZ"),  # not a symbol (with the near miss)
    ([], "nothing to set"),
])
def test_a_value_that_does_not_take_is_one_error_line_and_the_config_is_untouched(kfit, tmp_path, words, named):
    before = (tmp_path / ".config").read_bytes()
    run = kfit("config-set", *words)
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], run.stderr
    assert (tmp_path / ".config").read_bytes() == before
    assert not (tmp_path / ".config.old").exists()


def test_make_config_set_takes_set_and_command_line_symbols(tmp_path):
    import os

    kc.make_defconfig("lenet5", out=tmp_path / ".config")
    cleared = ("KCONFIG_CONFIG", "KFIT_OVERRIDES", "KFIT_SET", "FORMAT", "MAKEFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if k not in cleared}

    def make(*args):
        return subprocess.run(["make", "-s", "--no-print-directory", "-f", str(ROOT / "Makefile"), *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    run = make("config-set", "SET=EPOCHS=2 LEARNING_RATE=0.02", "CONFIG_SEED=7")
    assert run.returncode == 0, run.stderr
    config = kc.read_config(tmp_path / ".config")
    assert (config.epochs, config.learning_rate, config.seed) == (2, 0.02, 7)
    before = (tmp_path / ".config").read_bytes()
    run = make("config-set", "SET=LEARNING_RATE=abc")
    assert run.returncode != 0 and (tmp_path / ".config").read_bytes() == before
    assert [line for line in run.stderr.splitlines() if line.startswith("error:")] == [
        line for line in run.stderr.splitlines() if not line.startswith("make:")], run.stderr
    assert "config-set" in make("help").stdout
    # a quoted value with spaces is one word, as a shell splits it; an unbalanced quote is one error line
    run = make("config-set", 'SET=HPO_SPACE="DROPOUT=0..0.5 WARMUP_STEPS=0..50" HPO_FOLDS=3')
    assert run.returncode == 0, run.stderr
    config = kc.read_config(tmp_path / ".config")
    assert (config.hpo_space, config.hpo_folds) == ("DROPOUT=0..0.5 WARMUP_STEPS=0..50", 3)
    before = (tmp_path / ".config").read_bytes()
    run = make("config-set", 'SET=HPO_SPACE="DROPOUT=0..0.5')
    assert run.returncode != 0 and (tmp_path / ".config").read_bytes() == before
    assert "error: SET=" in run.stderr and "quote a value with spaces whole" in run.stderr and "Traceback" not in run.stderr
