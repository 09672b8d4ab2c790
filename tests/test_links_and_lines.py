"""Families an audit found open, each tested by generated cases: kfit's own files never written through a link
nor into a directory a link names (savedefconfig's defconfig, caches, exports, make data's shards); make data
never blocks on a FIFO; every command-line mistake and every over-long value is one short error line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lib import fileio
from lib.fileio import UnsafeFileError


@pytest.mark.parametrize("kind", ["link to a file", "dangling link", "fifo", "directory"])
def test_savedefconfig_never_writes_through_what_is_planted_at_its_output(kind, tmp_path, kfit_here):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target = tmp_path / "defconfig"
    if kind == "link to a file":
        target.symlink_to(victim)
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "created")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(tmp_path / ".config")).returncode == 0
    result = kfit_here(tmp_path, "savedefconfig", KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("error:")
    assert victim.read_text() == "keep\n" and not (tmp_path / "created").exists()


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_no_write_lands_in_a_directory_a_link_names(depth, tmp_path):
    """write_atomic (every cache, run file, export and report): a link as the file's own directory is refused,
    whatever lies above it is the user's; nothing is written into the link's target."""
    outside = tmp_path / "outside"
    outside.mkdir()
    base = tmp_path / "owned"
    parent = base.joinpath(*(["sub"] * depth))
    parent.parent.mkdir(parents=True, exist_ok=True)
    parent.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        fileio.write_atomic(parent / "cache.json", b"{}")
    assert list(outside.iterdir()) == []


def test_a_component_below_a_directory_kfit_owns_may_not_be_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "export").symlink_to(outside, target_is_directory=True)
    for out in (run / "export", run / "export" / "sub" / "deeper"):
        with pytest.raises(UnsafeFileError):
            fileio.refuse_linked_components(out, run)
    fileio.refuse_linked_components(tmp_path / "elsewhere" / "x", run)  # the user's own path: its last part only


def test_make_data_refuses_a_linked_shards_directory_and_touches_nothing_there(tmp_path, kfit_here):
    outside = tmp_path / "outside"
    outside.mkdir()
    kept = {"000000-0000000.json": "keep", "000001-0000000.bin": "keep", "notes.txt": "keep"}
    for name, text in kept.items():
        (outside / name).write_text(text)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".shards").symlink_to(outside, target_is_directory=True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    result = kfit_here(tmp_path, "data", "--corpus", str(corpus), "--vocab", "300", "--out", "d")
    assert result.returncode == 2 and "symbolic link" in result.stderr, result.stderr
    assert {p.name: p.read_text() for p in outside.iterdir()} == kept


def test_make_data_never_blocks_on_a_fifo_named_as_its_tokenizer(tmp_path, kfit_here):
    os.mkfifo(tmp_path / "t.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n" * 50)
    result = kfit_here(tmp_path, "data", "--corpus", str(corpus), "--tokenizer", "t.json", "--out", "d")
    assert result.returncode == 2 and "TOKENIZER=t.json" in result.stderr, result.stderr
    assert "kfit reads only regular files" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow  # a kfit process each
@pytest.mark.parametrize("argv", [["nosuchcommand"], ["plan", "--bogus"], ["defconfig"], ["train", "--gpus"],
                                  ["plan", "--format", "xml"], ["sample", "--max-tokens"], ["--no-such-flag"]])
def test_a_command_line_mistake_is_one_error_line(argv, tmp_path):
    import subprocess
    import sys

    from tests.helpers import KFIT

    result = subprocess.run([*KFIT[:1], KFIT[1], *argv], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, env={k: v for k, v in os.environ.items() if k != "KFIT_OVERRIDES"})
    assert result.returncode == 2 and result.stderr.startswith("error:") and result.stderr.count("\n") == 1, \
        result.stderr
    assert "Traceback" not in result.stderr and sys.executable


@pytest.mark.parametrize("variable, command", [("GPU", ["plan"]), ("KCONFIG_SEED", ["randconfig"]),
                                               ("HW", ["plan"]), ("FREE_GB", ["plan"]), ("GPUS", ["plan"])])
@pytest.mark.parametrize("length", [2_000, 100_000])
def test_an_over_long_value_is_cut_in_its_error_line(variable, command, length, tmp_path, kfit_here):
    value = ("9" if variable in ("KCONFIG_SEED", "FREE_GB", "GPUS") else "A") * length
    result = kfit_here(tmp_path, *command, **{variable: value, "KCONFIG_CONFIG": str(tmp_path / ".config")})
    assert result.returncode == 2 and result.stderr.startswith("error:"), result.stderr[:300]
    assert result.stderr.count("\n") == 1 and len(result.stderr) < 1200, len(result.stderr)


@pytest.mark.parametrize("variable, value, needle", [
    ("MASTER_ADDR", "h\nerror: FORGED line", "is not a host name or address"),
    ("MASTER_ADDR", "a b", "is not a host name or address"),
    ("MASTER_PORT", "99999", "MASTER_PORT='99999' is too large"),
    ("MASTER_PORT", "0", "MASTER_PORT='0' is too small")])
def test_the_rendezvous_is_checked_before_torchrun_starts(variable, value, needle):
    from lib import distributed
    from lib.errors import KfitError

    env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", variable: value}
    with pytest.raises(KfitError, match=needle):
        distributed.torchrun_command(2, Path("x"), env)


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_a_hardware_profile_nested_too_deeply_is_one_error_line(depth, tmp_path, kfit_here):
    (tmp_path / "hw.json").write_text("[" * depth + "]" * depth)
    result = kfit_here(tmp_path, "plan", HW=str(tmp_path / "hw.json"), KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 2 and result.stderr.startswith("error:") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["lenet5\nerror: FORGED line", "fp32\x1b[2J", "\ufefflenet5"])
def test_a_name_with_control_characters_never_forges_a_line(name, tmp_path, kfit_here):
    result = kfit_here(tmp_path, "defconfig", name, KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "\x1b" not in result.stderr
    assert not (tmp_path / ".config").exists()


@pytest.mark.parametrize("planted", ["checkpoint.pt", "plan.json", "metrics.jsonl"])
def test_a_fifo_planted_in_a_run_directory_never_blocks_a_reader(planted, tmp_path):
    """export and report read a run's checkpoint, plan.json and metrics.jsonl: a FIFO there is refused (it
    would have blocked torch.load or the report for ever)."""
    from lib import checkpoint, run_report
    from lib.errors import KfitError

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / planted)
    if planted == "checkpoint.pt":
        with pytest.raises(KfitError, match="kfit reads only regular files"):
            checkpoint.load_checkpoint(run / planted)
    elif planted == "metrics.jsonl":
        with pytest.raises(KfitError):
            run_report.read_history(run)
    else:
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        run_report.write_report(run, tmp_path / "r.html")  # plan.json unreadable: the page without the plan


@pytest.mark.parametrize("url", ["sqlite:///x.db?key=S3CRETKEY", "https://h/x?sig=S3CRETSIG&a=1",
                                 "postgresql://u:p@ss:S3CRETPW@127.0.0.1:1/db"])
def test_credentials_in_urls_never_print(url):
    from lib.redact import redact

    assert "S3CRET" not in redact(f"error: no study in HPO_STORAGE={url}: check it")


def test_a_tilde_of_an_unknown_user_is_one_error_line(tmp_path, kfit_here):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n" * 20)
    result = kfit_here(tmp_path, "data", "--corpus", str(corpus), "--vocab", "300", "--out", "~nosuchuser-kfit/x")
    assert result.returncode == 2 and "~ of a user this machine does not know" in result.stderr


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("filename", [None, "runs/x/.checkpoint.pt.tmp"])
def test_a_full_disk_anywhere_is_one_error_line(code, filename, capsys):
    import errno

    from lib.cli.common import run_main

    def full():
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), filename)
    assert run_main(full) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no space left on the device") and err.count("\n") == 1
