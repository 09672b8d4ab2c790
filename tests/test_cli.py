"""The command line's flags (lib/cli/flags.py): one for every variable the make targets take, named with
its variable in --help, winning over the variable; and `kfit plan --gpu h100 --free-gb 70 --format json`
is `make plan GPU=h100 FREE_GB=70 FORMAT=json`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lib.cli import flags, main, parser
from lib.errors import KfitError

ROOT = Path(__file__).resolve().parent.parent
# make variables of other programs than kfit: the GPU validation and benchmark scripts, the torch install
NOT_KFIT = {"DEVICE", "QUICK", "CHECKS", "REPEATS", "STEPS", "TORCH_SPEC", "LOAD"}
CLEARED = {*flags.FLAGS, "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS"}


def _subcommands():
    sub = next(a for a in parser()._actions if a.dest == "command")
    return sub.choices


def _help(command) -> str:
    return command.format_help()


def test_every_make_variable_has_a_flag_shown_with_its_variable():
    text = "".join(p.read_text() for p in [ROOT / "Makefile", *sorted((ROOT / "scripts" / "make").glob("*.mk"))])
    text = re.sub(r'SET="[^"]*"', "", text)  # SET="A=1 B=2" is --set A=1 --set B=2: config symbols, not flags
    variables = set(re.findall(r"\b([A-Z][A-Z_]+)=", text)) - NOT_KFIT
    assert variables - set(flags.FLAGS) == set(), "make variables without a flag"
    helps = "\n".join(_help(c) for c in _subcommands().values())
    for name, flag in flags.FLAGS.items():
        assert re.search(rf"{re.escape(flag.option)}\b.*?\(env\s+{name}\)", helps, re.S), name


def test_every_subcommand_has_complete_help(capsys):
    for name in _subcommands():
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines to the terminal
        assert exit_.value.code == 0 and out.startswith(f"usage: kfit {name}"), name
        assert "--config FILE" in out and "(env KCONFIG_CONFIG)" in out and "exit status: 0 done" in out, name


def _run(argv, monkeypatch, **env) -> tuple[int, str, str]:
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("signal.signal", lambda *args: None)  # main() would reset SIGPIPE for pytest
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_a_flag_wins_over_its_variable_and_is_restored(tmp_path, monkeypatch):
    config = str(tmp_path / ".config")
    code, out, err = _run(["plan", "--gpu", "h100", "--free-gb", "70", "--format", "json", "--config", config],
                          monkeypatch, GPU="a100-40gb", FREE_GB="30", FORMAT="text")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["device_name"] == "NVIDIA H100 80GB HBM3" and plan["hardware"]["gpus"][0]["free_bytes"] == 70 * 2**30
    assert os.environ["GPU"] == "a100-40gb" and os.environ["FREE_GB"] == "30"  # main() is also called in-process
    assert "KCONFIG_CONFIG" not in os.environ and not (tmp_path / ".config").exists()  # plan writes no config


def test_a_bad_flag_value_is_one_error_naming_the_flag(tmp_path, monkeypatch):
    code, out, err = _run(["plan", "--gpus", "two", "--config", str(tmp_path / ".config")], monkeypatch)
    assert code == 2 and err.strip().splitlines() == ["error: --gpus: GPUS='two' is not a number: give a whole "
                                                      "number from 1 to 4,096"], err
    code, out, err = _run(["plan", "--format", "xml", "--config", str(tmp_path / ".config")], monkeypatch)
    assert code == 2 and err.startswith("error: --format: FORMAT='xml' is not accepted") and "Traceback" not in err


def test_defconfig_takes_fragments_and_config_flags(tmp_path, monkeypatch):
    config = tmp_path / "my.config"
    code, out, err = _run(["defconfig", "lenet5", "--fragments", "cpu-smoke fp32", "--config", str(config)],
                          monkeypatch, FRAGMENTS="no-such-fragment")
    assert code == 0, err
    assert f"written to {config} (defconfig lenet5 + cpu-smoke, fp32)" in out
    assert "CONFIG_MAX_STEPS=3" in config.read_text()


def _volatile(plan: dict) -> dict:
    """The plan without this host's live readings, which change from one process to the next: idle cores,
    available RAM and free disk (and the thread and worker reasons that quote the idle cores)."""
    plan = json.loads(json.dumps(plan))
    for key in ("idle_cores", "ram_available_bytes"):
        plan["hardware"]["cpu"].pop(key)
    plan["hardware"].pop("disk_free_bytes")
    for key in ("cpu_threads", "workers"):
        plan["reasons"][key] = re.sub(r"[\d.]+ of (\d+) usable cores idle", r"? of \1 usable cores idle",
                                      plan["reasons"][key])
    return plan


@pytest.mark.slow
def test_kfit_plan_flags_equal_make_plan_variables(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["KCONFIG_CONFIG"] = str(tmp_path / ".config")  # none there: both plan the default defconfig in memory
    kfit = subprocess.run([sys.executable, str(ROOT / "scripts" / "kfit.py"), "plan", "--gpu", "h100",
                           "--free-gb", "70", "--format", "json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    make = subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "plan", "GPU=h100",
                           "FREE_GB=70", "FORMAT=json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert kfit.returncode == make.returncode == 0, kfit.stderr + make.stderr
    flagged, made = json.loads(kfit.stdout), json.loads(make.stdout)
    assert flagged["device_name"] == "NVIDIA H100 80GB HBM3" and flagged["micro_batch"] > 0
    assert _volatile(flagged) == _volatile(made)
    assert list(tmp_path.iterdir()) == []


def test_new_defconfigs_go_to_the_checkout_or_else_the_working_directory(monkeypatch, tmp_path):
    """Installed, a bare DEFCONFIG=name / recommend --write goes to ./defconfigs, never into site-packages."""
    from lib import config as kconfig, resources
    from lib.cli.common import apply_hint, new_defconfig_dir

    assert new_defconfig_dir() == kconfig.DEFCONFIG_DIR
    assert apply_hint(kconfig.DEFCONFIG_DIR / "x") == "'make x-defconfig' applies it"
    monkeypatch.setattr(resources, "CHECKOUT", None)
    assert new_defconfig_dir() == Path("defconfigs")
    assert apply_hint(Path("defconfigs/x")) == "'kfit defconfig defconfigs/x' applies it"


def test_make_command_line_is_decoded_as_typed_and_split_into_variables_and_overrides():
    """KFIT_OVERRIDES is make's escaped list ($(MAKEOVERRIDES)): spaces as '\\ ', '$' doubled, last given first."""
    text = r"EPOCHS=2 PROMPT=a\ \"b\"\ $$$$(x)\ \\ FRAGMENTS=cpu-smoke\ fp32"
    pairs = flags.make_assignments(text)
    assert pairs == [("FRAGMENTS", "cpu-smoke fp32"), ("PROMPT", 'a "b" $$(x) \\'), ("EPOCHS", "2")]
    variables, overrides = flags.overrides_from_make(
        [*pairs, ("PRECISION", "bf16"), ("CUDA_VISIBLE_DEVICES", "0"), ("V", "1"), ("CONFIG_SEED", "2")],
        "train", {"KCONFIG_CONFIG", "RESUME"})
    assert variables == {"FRAGMENTS": "cpu-smoke fp32", "PROMPT": 'a "b" $$(x) \\'}
    assert overrides == [("EPOCHS", "2"), ("PRECISION_BF16", "y"), ("SEED", "2")]


@pytest.mark.parametrize("pair,needle", [
    (("MAX_STEP", "3"), "did you mean CONFIG_MAX_STEPS"), (("EPOCH", "1"), "did you mean CONFIG_EPOCHS"),
    (("epochs", "1"), "did you mean CONFIG_EPOCHS"), (("PRECISION", "FP8"), "PRECISION is a choice of AUTO, BF16, FP16, FP32, not 'FP8'"),
    (("CONFIG_NO_SUCH", "1"), "is not a kfit variable or Kconfig symbol"), (("ZZQX", "1"), "'make menuconfig'"),
    (("SEED", "1"), "write CONFIG_SEED=1")])
def test_a_make_variable_that_is_not_kfits_is_refused_as_set_refuses_it(pair, needle):
    """make train EPOCH=1 trained the whole default run after a warning, SET="EPOCHZ=2" was an error: both
    are one error now, with the suggestion, and nothing runs."""
    with pytest.raises(KfitError, match=re.escape(needle)):
        flags.overrides_from_make([pair], "train", {"KCONFIG_CONFIG"})
    if pair[0] != "SEED":  # SEED= is a variable of make sample, which --set never names
        with pytest.raises(KfitError, match=re.escape(needle)):
            flags.set_option("=".join(pair))


def test_set_overrides_one_command_and_refuses_what_does_not_take(tmp_path, monkeypatch):
    from lib import config as kconfig

    monkeypatch.chdir(tmp_path)
    for key in CLEARED | {flags.MAKE_LIST, flags.SET_VARIABLE}:
        monkeypatch.delenv(key, raising=False)
    kconfig.make_defconfig("lenet5", out=tmp_path / ".config")
    before = (tmp_path / ".config").read_bytes()

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        return code, out.getvalue(), err.getvalue()

    code, out, err = run("plan", "--gpu", "cpu", "--format", "json", "--set", "EPOCHS=3", "--set", "CONFIG_SEED=9")
    assert code == 0, err
    assert "overrides: CONFIG_EPOCHS=3 CONFIG_SEED=9 (command line; .config unchanged)" in json.loads(out)["notes"]
    for argv, needle in ((("plan", "--set", "EPOCHS=abc"), "CONFIG_EPOCHS"),
                         (("plan", "--set", "MAX_STEP=1"), "did you mean CONFIG_MAX_STEPS"),
                         (("plan", "--set", "EPOCHS=2\nCONFIG_SEED=1"), "line break")):
        code, out, err = run(*argv)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and needle in lines[0], err
    monkeypatch.setenv(flags.MAKE_LIST, r"SET=EPOCHS=4\ CONFIG_SEED=7")  # make train SET="EPOCHS=4 CONFIG_SEED=7"
    code, out, err = run("plan", "--gpu", "cpu", "--format", "json")
    assert code == 0, err
    assert "overrides: CONFIG_EPOCHS=4 CONFIG_SEED=7 (command line; .config unchanged)" in json.loads(out)["notes"]
    monkeypatch.setenv(flags.MAKE_LIST, "SET=EPOCHS=abc")
    code, out, err = run("plan", "--gpu", "cpu")
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")][0].count("CONFIG_EPOCHS")
    monkeypatch.setenv(flags.MAKE_LIST, "EPOCHS=2")
    code, out, err = run("savedefconfig")
    assert code == 2 and "does not train or plan" in err
    assert (tmp_path / ".config").read_bytes() == before and not (tmp_path / "defconfig").exists()


def test_version_prints_kfits_pythons_and_torchs_versions_and_the_device(capsys):
    import re

    import torch

    import lib

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    stated = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert lib.__version__ == stated and lines[0].startswith(f"kfit {stated} (checkout ")
    assert lines[1].startswith("Python ") and lines[2].startswith(f"torch {torch.__version__} (")
    assert lines[3].startswith("device: ")
