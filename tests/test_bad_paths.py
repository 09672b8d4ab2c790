"""Paths and values the OS refuses end in one `error:` line naming the path and the fix, never a traceback:
a name over 255 bytes, a path of thousands, a loop of links, a dangling link, a file where a directory must
be, a directory where a file must be. Listed cases in the quick tier; generated ones in the slow tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lib import config as kc

pytestmark = pytest.mark.usefixtures("one_thread")


def checked(done) -> str:
    """The command either ran or was refused in one error line, without a traceback."""
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert (done.returncode == 0 and not errors) or (done.returncode == 2 and len(errors) == 1), text[-3000:]
    return errors[0] if errors else ""


def planted(tmp_path: Path, kind: str) -> str:
    """A path of the given kind, under tmp_path."""
    if kind == "long-name":
        return str(tmp_path / ("n" * 300))
    if kind == "long-path":
        return str(tmp_path / "/".join(["segment"] * 700))
    if kind == "loop":
        (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
        (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
        return str(tmp_path / "loop-a" / "x")
    if kind == "file-as-directory":
        (tmp_path / "plain").write_text("x\n")
        return str(tmp_path / "plain" / "sub")
    if kind == "dangling":
        (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
        return str(tmp_path / "gone")
    raise ValueError(kind)


KINDS = ["long-name", "long-path", "loop", "file-as-directory", "dangling"]


@pytest.fixture
def lenet(tmp_path):
    kc.make_defconfig("lenet5", out=tmp_path / ".config")
    return tmp_path


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_dir_the_os_refuses_is_one_error(lenet, kfit_here, kind):
    line = checked(kfit_here(lenet, "train", "--set", f"OUTPUT_DIR={planted(lenet, kind)}", "--set", "MAX_STEPS=1"))
    assert line or kind == "dangling"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variable, command", [("KCONFIG_CONFIG", "plan"), ("HW", "plan"), ("RUN", "export"),
                                               ("RUN", "report"), ("INIT_FROM", "train")])
def test_a_path_variable_the_os_refuses_is_one_error(lenet, kfit_here, kind, variable, command):
    line = checked(kfit_here(lenet, command, **{variable: planted(lenet, kind)}))
    # none of them names something usable; but `make plan` without a config file previews the default defconfig
    assert line or variable == "KCONFIG_CONFIG"


def test_a_run_name_over_255_bytes_is_one_error(lenet, kfit_here):
    line = checked(kfit_here(lenet, "train", "--set", "RUN_NAME=" + "r" * 300, "--set", "MAX_STEPS=1"))
    assert "File name too long" in line and "255 bytes" in line and "more characters" in line


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=400)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["KCONFIG_CONFIG", "HW", "RUN", "OUT", "INIT_FROM", "RESUME_FROM", "PROMPT", "GPUS",
                        "FREE_GB", "NNODES", "MAX_TOKENS", "HPO_STORAGE", "TRIALS"]), texts)
def test_any_text_in_any_variable_is_run_or_one_error(lenet, kfit_here, variable, value):
    command = {"RUN": "export", "OUT": "report", "PROMPT": "sample", "MAX_TOKENS": "sample", "HPO_STORAGE": "hpo-status",
               "TRIALS": "hpo-status", "INIT_FROM": "plan", "RESUME_FROM": "plan"}.get(variable, "plan")
    try:
        done = kfit_here(lenet, command, **{variable: value})
    except ValueError as err:  # the environment itself cannot hold it (an embedded NUL): nothing to run
        assert "null" in str(err).lower()
        return
    line = checked(done)
    assert len(line) < 2000 and all(not l.startswith("error: ") for l in line.splitlines()[1:])


def test_random_bytes_named_txt_are_refused_before_tokenizing(tmp_path):
    import random

    from lib.data.corpus import find_sources
    from lib.errors import KfitError

    (tmp_path / "good.txt").write_text("plain text, café\n" * 100)
    assert find_sources(str(tmp_path / "good.txt"))
    rng = random.Random(7)
    (tmp_path / "noise.txt").write_bytes(bytes(rng.randrange(256) for _ in range(5000)))
    with pytest.raises(KfitError, match=r"noise.txt is not text \(its first 5,000 bytes hold"):
        find_sources(str(tmp_path))


@settings(max_examples=25, deadline=None)
@given(text_kib=st.integers(1, 400), noise_kib=st.integers(8, 200), where=st.sampled_from(["end", "middle"]),
       seed=st.integers(0, 2**16))
def test_binary_data_anywhere_in_a_text_file_is_refused(tmp_path_factory, text_kib, noise_kib, where, seed):
    """100 KB of text followed by 300 KB of random bytes was tokenized without a word: only the first 64 KiB was
    looked at (an audit). The start, middle and end are sampled now; text cut at any byte stays text."""
    import random

    from lib.data.corpus import find_sources
    from lib.errors import KfitError

    folder = tmp_path_factory.mktemp("corpus")
    text = ("plain text, café, 日本語 ✓\n" * (text_kib * 40))[:text_kib * 1024].encode()
    noise = random.Random(seed).randbytes(noise_kib * 1024)
    (folder / "ok.txt").write_bytes(text + text[:1000])  # a file of text only, cut inside a character
    assert find_sources(str(folder / "ok.txt"))
    data = text + noise if where == "end" else text + noise + text
    if len(data) > 3 * (64 << 10) and where == "middle" and noise_kib < 64:
        return  # a small island of noise between large texts may fall between the samples
    (folder / "mixed.txt").write_bytes(data)
    with pytest.raises(KfitError, match=r"mixed.txt is not text \("):
        find_sources(str(folder / "mixed.txt"))
