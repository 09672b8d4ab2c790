"""Families an audit found open, each tested by generated cases: kfit's own files never written through a link
nor into a directory a link names (savedefconfig's defconfig, caches, exports, make data's shards); make data
never blocks on a FIFO; every command-line mistake and every over-long value is one short error line."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

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


# -- what a user's file says, shown: escaped, and a secret's value hidden ------------------------------------------

HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
# text a file may hold on one line: any character but the line's end, with control and format characters (a
# terminal's escapes, U+200B, U+202E) drawn often
line_text = st.text(alphabet=st.one_of(st.characters(codec="utf-8", blacklist_characters="\n\r"),
                                       st.sampled_from("\x1b\x07\x9b\u200b\u202e\u2066\ufeff\u2028\x85\x0b\x0c")),
                    min_size=1, max_size=30)


def visible(text: str) -> bool:
    import unicodedata

    return not any(unicodedata.category(c) in HIDDEN for c in text)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=line_text, cpu=line_text, note=line_text)
def test_a_hardware_profiles_text_is_printed_escaped(name, cpu, note, tmp_path, kfit_here):
    """Every string a HW= profile holds (a GPU's name is in half the plan's lines) is printed escaped: no line
    of `kfit plan` is forged, none holds a terminal's escape or an invisible character (a plan each: 3 s)."""
    import json

    from lib.hardware.simulate import resolve_hardware

    def plan(name, cpu, note):
        profile = json.loads(resolve_hardware(gpu="h100").to_json())
        profile["gpus"][0]["name"], profile["cpu"]["name"], profile["notes"] = name, cpu, [note]
        (tmp_path / "hw.json").write_text(json.dumps(profile))
        result = kfit_here(tmp_path, "plan", HW=str(tmp_path / "hw.json"), KCONFIG_CONFIG=str(tmp_path / ".config"))
        assert result.returncode == 0, result.stderr
        return (result.stdout + result.stderr).splitlines()

    if not PLAIN_PLAN:
        PLAIN_PLAN.extend(plan("A GPU", "A CPU", "a note"))
    lines = plan("A GPU " + name, cpu, note)  # never a name of the catalog's, whose figures would change the plan
    assert len(lines) == len(PLAIN_PLAN), "\n".join(map(ascii, lines))  # as many lines as plain names give
    for line in lines:
        assert visible(line), ascii(line)


PLAIN_PLAN: list[str] = []


def quoted(value: str) -> str:
    """`value` as a .config string (kconfiglib's escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@settings(max_examples=30, deadline=None)
@given(first=line_text, second=line_text)
def test_a_value_set_more_than_once_is_shown_escaped(first, second, tmp_path_factory):
    """kconfiglib's "set more than once" quotes both values: each problem of a config is one escaped entry of
    the error (str(err) is what the API raises and make prints), never a forged entry or a hidden character."""
    from lib.config import kconfig
    from lib.errors import ConfigError

    assume(first != second)  # the same value twice is no contradiction
    path = tmp_path_factory.mktemp("c") / "fragment"
    path.write_text(f"CONFIG_OUTPUT_DIR={quoted(first)}\nCONFIG_OUTPUT_DIR={quoted(second)}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        kconfig.load_strict([kconfig.ROOT / "defconfigs" / "lenet5", path])
    head, *entries = str(caught.value).split("\n  ")
    assert head == "invalid configuration:" and len(entries) == 1, ascii(str(caught.value))
    assert "set more than once" in entries[0] and visible(entries[0]), ascii(entries[0])


secret_names = st.sampled_from(["NOSUCH_TOKEN", "HPO_PASSWORD", "WANDB_API_KEY", "DB_PASSWD", "MY_SECRET",
                                "S3_ACCESS_KEY", "X_CREDENTIALS", "tracking_token"])
secret_values = st.text(alphabet="abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789!$%^()[]{}<>|~",
                        min_size=5, max_size=20).map(lambda s: "Zq9" + s)  # no word of a message


@settings(max_examples=30, deadline=None)
@given(name=secret_names, secret=secret_values, form=st.integers(0, 4))
def test_a_value_assigned_to_a_secrets_name_is_never_shown(name, secret, form, tmp_path_factory):
    """An unknown symbol named as a secret (CONFIG_NOSUCH_TOKEN="..."), a line that is not a CONFIG_ line,
    given as a config: the error names the line and the symbol, never the value, however the line is written."""
    from lib.config import kconfig
    from lib.errors import ConfigError

    line = [f"CONFIG_{name}={quoted(secret)}", f"CONFIG_{name}={secret}", f"CONFIG_{name}='{secret}'",
            f"{name}={secret}", f"CONFIG_{name} {secret}"][form]
    path = tmp_path_factory.mktemp("c") / "fragment"
    path.write_text(f"CONFIG_SEED=3\n{line}\n")
    with pytest.raises(ConfigError) as caught:
        kconfig.load_strict([kconfig.ROOT / "defconfigs" / "lenet5", path])
    assert secret not in str(caught.value) and f"{path}:2" in str(caught.value), str(caught.value)


def test_an_unknown_secret_symbol_is_one_error_line_without_its_value(tmp_path, kfit_here):
    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(tmp_path / ".config")).returncode == 0
    with open(tmp_path / ".config", "a") as f:
        f.write('CONFIG_NOSUCH_TOKEN="hunter2sEcret"\n')
    result = kfit_here(tmp_path, "plan", KCONFIG_CONFIG=str(tmp_path / ".config"), GPU="h100")
    assert result.returncode == 2 and result.stderr.startswith("error:") and result.stderr.count("\n") == 1
    assert "NOSUCH_TOKEN" in result.stderr and "hunter2sEcret" not in result.stdout + result.stderr


# -- a number too long for Python to convert is out of range, not "not a number" --------------------------------

huge_numerals = st.tuples(st.sampled_from(["", "+", "-"]), st.integers(4_301, 30_000), st.sampled_from("123456789")
                          ).map(lambda t: t[0] + t[2] * t[1])


@settings(max_examples=30, deadline=None)
@given(value=huge_numerals, name=st.sampled_from(["NODE_RANK", "TRIALS", "GPUS", "MAX_TOKENS", "FREE_GB", "SEED"]),
       kind=st.sampled_from([int, float]))
def test_a_numeral_of_thousands_of_digits_is_out_of_range(value, name, kind):
    """Every integer or float variable read through env_number (NODE_RANK, TRIALS, GPUS...): a 5,000-digit value
    says it is out of range, quoted cut short, never "not a number"."""
    from lib.env import env_number
    from lib.errors import KfitError

    with pytest.raises(KfitError) as caught:
        env_number(name, kind, env={name: value}, minimum=0, maximum=10)
    message = str(caught.value)
    assert "out of range" in message and "not a number" not in message and len(message) < 300, message


@pytest.mark.parametrize("variable, value", [("NODE_RANK", "7" * 5000), ("NNODES", "3" * 5000),
                                             ("NNODES", f"1:{'9' * 5000}")])
def test_a_node_count_or_rank_of_thousands_of_digits_is_out_of_range(variable, value):
    from lib import distributed
    from lib.errors import KfitError

    env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", variable: value}
    with pytest.raises(KfitError, match="out of range") as caught:
        distributed.torchrun_command(2, Path("x"), env)
    assert "not a number" not in str(caught.value) and len(str(caught.value)) < 400


@pytest.mark.parametrize("value", ["9" * 5000, f"1-{'2' * 5000}", f"{'5' * 10}:00"])
def test_a_slurm_time_limit_of_thousands_of_digits_is_out_of_range(value):
    from lib.cli.sbatch import time_limit_seconds
    from lib.errors import KfitError

    with pytest.raises(KfitError, match="out of range") as caught:
        time_limit_seconds(value)
    assert len(str(caught.value)) < 400


def test_trials_of_thousands_of_digits_is_one_error_line(tmp_path, kfit_here):
    result = kfit_here(tmp_path, "hpo", TRIALS="9" * 5000, KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and len(result.stderr) < 400
    assert "TRIALS='99999" in result.stderr and "is out of range" in result.stderr, result.stderr


# -- a file that holds a secret is the owner's only ---------------------------------------------------------------

@pytest.mark.parametrize("before", [None, 0o644, 0o755])
def test_an_sbatch_script_holding_a_database_password_is_the_owners_only(before, tmp_path, kfit_here):
    """ARRAY=N embeds HPO_STORAGE (a database URL with its password) in the script: it is written 0700 from its
    first byte, whatever file it replaces, and the password is never printed."""
    import stat

    out = tmp_path / "job.sbatch"
    if before is not None:
        out.write_text("old\n")
        out.chmod(before)
    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(tmp_path / ".config")).returncode == 0
    result = kfit_here(tmp_path, "sbatch", ARRAY="2", CPUS="1", GPU="h100", OUT=str(out),
                       HPO_STORAGE="postgresql://kfit:Pa55w0rdXYZ@db.example/optuna",
                       KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 0, result.stderr
    assert "Pa55w0rdXYZ" in out.read_text() and "Pa55w0rdXYZ" not in result.stdout + result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


@settings(max_examples=30, deadline=None)
@given(before=st.one_of(st.none(), st.integers(0o400, 0o777)), mode=st.sampled_from([0o600, 0o700, 0o640]))
def test_a_write_with_a_mode_has_that_mode_whatever_it_replaces(before, mode, tmp_path_factory):
    import stat

    from lib.fileio import write_atomic

    path = tmp_path_factory.mktemp("w") / "f"
    if before is not None:
        path.write_text("old")
        path.chmod(before)
    seen = []
    write_atomic(path, lambda tmp: seen.append(stat.S_IMODE(os.stat(tmp).st_mode)), mode=mode)
    assert stat.S_IMODE(path.stat().st_mode) == mode and seen[0] & 0o077 == 0  # private while it is written


@pytest.mark.slow  # a kfit process each: 14 s of the quick tier
@settings(max_examples=5, deadline=None)
@given(before=st.text(alphabet="abc xyz", max_size=10), byte=st.integers(0x80, 0xff))
def test_a_prompt_that_is_not_utf8_is_one_error_line(before, byte):
    """PROMPT= holding a byte that is not UTF-8 (os.environ keeps it as a lone surrogate): one error line naming
    the byte, checked before any run is looked for (make sample had ended in a traceback encoding it)."""
    import subprocess
    import sys

    from tests.helpers import KFIT

    prompt = os.fsencode(before) + bytes([byte]) + b" end"
    env = {k: v for k, v in os.environ.items() if k not in ("KFIT_OVERRIDES", "RUN")}
    env = {os.fsencode(k): os.fsencode(v) for k, v in env.items()} | {b"PROMPT": prompt}
    result = subprocess.run([*KFIT[:1], KFIT[1], "sample"], capture_output=True, env=env, timeout=120)
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2 and err.startswith("error: PROMPT=") and err.count("\n") == 1, err
    assert f"byte 0x{byte:02x}" in err and "Traceback" not in err


def _plant(path: Path, kind: str) -> str:
    """Put `kind` at `path`; the words the error line must use for it."""
    if kind == "loop":
        os.symlink(path.name, path)
        return "a symbolic link that loops"
    if kind == "dangling":
        os.symlink("nowhere-" + path.name, path)
        return "which does not exist"
    os.mkfifo(path)
    return "a FIFO"


# (what the user names, how: the reader's variable, and the path's role in its directory)
READERS = {"CORPUS": ("data", "corpus.txt"), "RUN": ("report", "run/metrics.jsonl"),
           "DATA_DIR": (None, "data"), "KCONFIG_CONFIG": ("plan", "my.config")}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", ["loop", "dangling", "fifo"])
def test_a_link_that_loops_or_dangles_or_a_fifo_is_named_as_what_it_is(reader, kind, tmp_path, kfit_here):
    """Every reader of a path the user names tells a looping link, a dangling one and a FIFO from a missing
    file (Path.exists() and is_file() answer False for all of them): one error line with its kind, never
    "does not exist" of something that is there, and nothing read or written through it."""
    from lib.data.files import data_directory
    from lib.errors import DataError

    command, relative = READERS[reader]
    if (reader, kind) in {("KCONFIG_CONFIG", "dangling"), ("KCONFIG_CONFIG", "fifo")}:
        pytest.skip("a config's dangling link is written through as make's targets do; a FIFO config is "
                    "test_savedefconfig's")
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    words = _plant(path, kind)
    if command is None:  # CONFIG_DATA_DIR: read where the task loads, before a run starts
        with pytest.raises(DataError) as err:
            data_directory(str(path), "train.bin and val.bin")
        errors = [f"error: {err.value}"]
    else:
        done = kfit_here(tmp_path, command, **({"RUN": str(path.parent)} if reader == "RUN" else {reader: str(path)}))
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode != 0 and len(errors) == 1, done.stderr[-2000:]
    assert words in errors[0] and "does not exist:" not in errors[0] and "no such" not in errors[0], errors[0]
    assert os.path.islink(path) or fileio.what_is(path) == "a FIFO"  # still there, untouched


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=st.integers(1, 5), end=st.sampled_from(["file", "directory", "nothing", "loop", "fifo"]))
def test_what_is_follows_links_to_what_they_name(chain, end, tmp_path_factory):
    """what_is through a chain of links: None for a file or directory at its end, MISSING only where nothing is
    there at all, the loop or the dangling end named otherwise."""
    root = tmp_path_factory.mktemp("chain")
    last = root / "end"
    if end == "file":
        last.write_text("x")
    elif end == "directory":
        last.mkdir()
    elif end == "fifo":
        os.mkfifo(last)
    elif end == "loop":
        os.symlink("end", last)
    names = [root / f"link{i}" for i in range(chain)]
    for i, name in enumerate(names):
        os.symlink((names[i + 1] if i + 1 < chain else last).name, name)
    got = fileio.what_is(names[0])
    expected = {"file": None, "directory": None, "fifo": "a FIFO"}.get(end)
    if end == "nothing":
        assert got.startswith("a symbolic link to ") and got.endswith("which does not exist")
        assert fileio.what_is(last) == fileio.MISSING
    elif end == "loop":
        assert got.startswith("a symbolic link that loops")
    else:
        assert got == expected


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["RUN_NAME", "OUTPUT_DIR", "TRACKING_PROJECT", "OPTIMIZER_NAME", "EPOCHS"]),
       before=st.text(alphabet="abc-_/", max_size=8), byte=st.integers(0x80, 0xff), after=st.text(alphabet="xyz", max_size=5))
def test_a_value_that_is_not_utf8_is_one_error_line_however_it_is_set(name, before, byte, after):
    """A byte that is not UTF-8 in any config value (a make variable, SET=, --set, the API's derive) crashed
    writing the change with UnicodeEncodeError: it is one error naming the symbol, the config untouched."""
    from lib import config as kc
    from lib.errors import KfitError

    value = before + os.fsdecode(bytes([byte])) + after  # as Python hands a command line's bytes over
    with pytest.raises(KfitError, match=f"CONFIG_{name}=.* is not UTF-8 text") as err:
        kc.derive(_lenet5(), {name: value})
    assert "\n" not in str(err.value)


@functools.lru_cache(maxsize=1)
def _lenet5():
    import tempfile

    from lib import config as kc

    return kc.make_defconfig("lenet5", out=Path(tempfile.mkdtemp()) / ".config")


@pytest.mark.parametrize("reader", ["jsonl corpus line", "meta.json"])
@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_json_nested_thousands_deep_in_data_is_one_data_error(reader, depth, tmp_path):
    """A .jsonl corpus line of 200,000 '[' ended in a RecursionError traceback (an audit): every JSON a data
    directory holds is refused in one line."""
    from lib.data import corpus, text
    from lib.errors import DataError

    nested = "[" * depth + "]" * depth
    with pytest.raises(DataError) as err:
        if reader == "meta.json":
            (tmp_path / "meta.json").write_text(nested)
            text.read_meta(tmp_path)
        else:
            corpus._jsonl_text(corpus.Source("c.jsonl", "jsonl", 1, 0), nested.encode(), 0)
    assert "\n" not in str(err.value) and len(str(err.value)) < 1200


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.lists(st.sampled_from(["a", "\n", "\x1b[2J", "\u202e", "error: FORGED", "\r"]), min_size=1,
                     max_size=6).map("".join))
def test_a_path_in_a_success_line_never_forges_output(name, tmp_path, kfit_here):
    """`make report OUT=$'x\\nerror: FORGED'` printed a forged error line and a raw escape (an audit): the
    lines that name a file kfit wrote show its path escaped, as the error lines do."""
    config = tmp_path / ("cfg-" + name.replace("/", "_"))
    result = kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("# configuration written to "), result.stdout
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout


@settings(max_examples=40, deadline=None)
@given(digit=st.characters(categories=["Nd"]).filter(lambda c: not c.isascii()),
       name=st.sampled_from(["GPUS", "EPOCHS", "MAX_STEPS", "NNODES"]))
def test_digits_of_other_scripts_are_not_numbers(digit, name):
    """GPUS=٣ planned 3 processes and EPOCHS=٣ trained (an audit): Python's int() reads every script's digits;
    a number kfit takes is ASCII, as make, torchrun and a .config read it."""
    from lib import config as kc
    from lib.env import env_number
    from lib.errors import KfitError

    with pytest.raises(KfitError, match="is not a number"):
        env_number(name, int, env={name: digit * 2})
    if name in ("EPOCHS", "MAX_STEPS"):
        with pytest.raises(KfitError, match="ASCII digits"):
            kc.derive(_lenet5(), {name: digit})


def test_validate_gpu_refuses_a_device_it_does_not_know_before_any_check(tmp_path):
    """DEVICE=nosuch ran the whole validation and wrote its JSON (argparse never checks a default taken from
    the environment against its choices; an audit)."""
    import subprocess
    import sys

    out = tmp_path / "v.json"
    script = Path(__file__).resolve().parent.parent / "scripts" / "validate_gpu.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "DEVICE": "nosuch", "OUT": str(out)}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: DEVICE='nosuch' is not accepted")
    assert done.stderr.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("kind", ["link", "fifo", "directory"])
def test_sbatch_checks_its_script_and_config_copy_before_writing_either(kind, tmp_path, kfit_here):
    """`make sbatch OUT=<a planted link>` was refused after it had written <OUT>.config (a re-audit)."""
    from lib.errors import KfitError  # noqa: F401

    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(tmp_path / ".config")).returncode == 0
    out = tmp_path / "job.sbatch"
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    {"link": lambda: out.symlink_to(victim), "fifo": lambda: os.mkfifo(out), "directory": out.mkdir}[kind]()
    result = kfit_here(tmp_path, "sbatch", CPUS="1", GPU="h100", OUT=str(out), KCONFIG_CONFIG=str(tmp_path / ".config"))
    assert result.returncode == 2 and result.stderr.startswith("error:"), result.stderr
    assert not (tmp_path / "job.sbatch.config").exists() and victim.read_text() == "keep\n"


@pytest.mark.parametrize("where", ["cwd", "output_dir"])
@pytest.mark.parametrize("char", ["\n", "\r", "\x1b", "\x85", "\u2028"])
def test_sbatch_refuses_a_directory_whose_name_would_start_a_command_of_its_script(where, char, tmp_path, kfit_here):
    """A working or output directory named 'w<line break>touch PWNED #' became a command of the script
    `make sbatch` wrote (its #SBATCH --chdir= and --output= lines; an audit). Refused before anything is
    written, in one line."""
    odd = tmp_path / f"w{char}touch PWNED #"
    odd.mkdir()
    home = odd if where == "cwd" else tmp_path
    config = home / ".config"
    assert kfit_here(home, "defconfig", "lenet5", KCONFIG_CONFIG=str(config)).returncode == 0
    if where == "output_dir":  # a planted runs/ link to it: the script names the directory it resolves to
        (home / "runs").symlink_to(odd)
    before = sorted(p.name for p in home.rglob("*"))
    result = kfit_here(home, "sbatch", CPUS="1", GPU="h100", KCONFIG_CONFIG=str(config))
    assert result.returncode == 2 and result.stderr.startswith("error:") and result.stderr.count("\n") == 1, \
        result.stderr
    assert "#SBATCH" in result.stderr and sorted(p.name for p in home.rglob("*")) == before  # no script


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["OUTPUT_DIR", "DATA_DIR", "RUN_NAME", "TRACKING_PROJECT"]),
       before=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters='"\\'), max_size=8),
       after=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters='"\\'), max_size=8))
def test_a_nul_byte_in_any_string_option_is_refused_when_the_config_is_read(name, before, after, tmp_path):
    """CONFIG_OUTPUT_DIR="runs<NUL>x" reached mkdir as a traceback (embedded null byte), and DATA_DIR's became
    a misleading planner error (an audit): a NUL is refused with the config, naming the option."""
    from lib import config as kc
    from lib.errors import ConfigError

    fragment = tmp_path / "fragment"
    extra = "CONFIG_DATASET_DIR=y\n" if name == "DATA_DIR" else "CONFIG_TRACK_MLFLOW=y\n" \
        if name == "TRACKING_PROJECT" else ""
    fragment.write_bytes(f'{extra}CONFIG_{name}="{before}\0{after}"\n'.encode())
    with pytest.raises(ConfigError, match=f"CONFIG_{name}") as refused:  # a NUL, or RUN_NAME's own characters
        kc.make_defconfig("gpt2-tiny", [str(fragment)], out=tmp_path / ".config")
    assert "\0" not in str(refused.value)  # never shown raw


@pytest.mark.parametrize("bad", [{"MASTER_PORT": "99999999999"}, {"NODE_RANK": str(10**20)}, {"MASTER_PORT": "abc"},
                                 {"NODE_RANK": "5"}, {"MASTER_ADDR": "host;rm -rf /"}])
def test_a_machine_layout_that_cannot_launch_is_refused_before_the_plan(bad, tmp_path, kfit_here):
    """NNODES=2 with a port or node rank torchrun cannot take planned the run and printed 'Launching ...'
    before its error (an audit): refused first, in one line, nothing planned."""
    config = tmp_path / ".config"
    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(config)).returncode == 0
    variables = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", **bad}
    result = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(config), **variables)
    assert result.returncode == 2 and result.stderr.startswith("error:"), result.stdout + result.stderr
    assert "Launching" not in result.stdout + result.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["1000000000", "4097", "-1", "abc"])
def test_an_openmp_thread_count_past_any_machine_is_refused_before_any_work(value, tmp_path, kfit_here):
    """OMP_NUM_THREADS=1000000000 planned for a minute, then libgomp asked for 216 GB and kfit exited 1 with no
    error line of its own (an audit)."""
    config = tmp_path / ".config"
    assert kfit_here(tmp_path, "defconfig", "lenet5", KCONFIG_CONFIG=str(config)).returncode == 0
    result = kfit_here(tmp_path, "plan", KCONFIG_CONFIG=str(config), OMP_NUM_THREADS=value)
    assert result.returncode == 2 and result.stderr.startswith("error: OMP_NUM_THREADS="), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("where", ["config", "fragment"])
@pytest.mark.parametrize("line", ["CONFIG_EPOCHS=2", "# CONFIG_MONITOR is not set", "CONFIG_RUN_NAME=\"x\""])
def test_a_setting_behind_a_byte_order_mark_is_named_with_its_fix(where, line, tmp_path):
    """A line saved with an invisible BOM before its CONFIG_ setting was refused as 'malformed (its text is not
    shown)' (an audit): the message names the mark and how to remove it."""
    from lib import config as kc
    from lib.errors import ConfigError

    path = tmp_path / "fragment"
    if where == "config":
        kc.make_defconfig("lenet5", out=path)
        path.write_bytes(path.read_bytes() + f"\ufeff{line}\n".encode())
        read = lambda: kc.read_config(path)  # noqa: E731
    else:
        path.write_bytes(f"\ufeff{line}\n".encode())
        read = lambda: kc.make_defconfig("lenet5", [str(path)], out=tmp_path / ".config")  # noqa: E731
    with pytest.raises(ConfigError, match=r"byte-order mark \(U\+FEFF\).*save the file as UTF-8 without BOM"):
        read()
