"""One redaction (lib/redact.py) for every line kfit prints or records: generated credentials in URLs, query
strings, NAME=value pairs and JSON never survive it, ordinary figures pass untouched; a user's value shown in
a message is one escaped, bounded line; a file that is not a config is never echoed."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import assume, given, settings, strategies as st

from lib.redact import RedactingStream, redact, shown

secrets = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="@/?&#;=:'\","),
                  min_size=6, max_size=24).filter(lambda s: s.strip("*") and "***" not in s)
names = st.sampled_from(["password", "PASSWORD", "sslpassword", "passwd", "pwd", "token", "api_key", "apikey",
                         "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "secret", "client_secret", "access_key",
                         "AWS_SECRET_ACCESS_KEY", "auth", "credentials"])
schemes = st.sampled_from(["postgresql", "postgresql+psycopg2", "mysql", "https", "http", "redis", "databricks"])


glued = st.sampled_from(["", "x", "1", "_", "HPO_STORAGE=", "HPO_STORAGE_", "a" * 60, "9" * 60 + "_", "a-b.c+"])


@settings(max_examples=300, deadline=None)
@given(secrets, names, schemes, st.integers(0, 4), glued)
def test_no_generated_credential_survives(secret, name, scheme, form, before):
    line = [f"could not connect to {before}{scheme}://someone:{secret}@db.example:5432/x (timeout)",
            f"GET https://h.example/api?{name}={secret}&page=2 failed",
            f"env: {name}={secret} HOME=/root",
            json.dumps({"error": "denied", name: secret}),
            f"machine h.example login me password {secret}"][form]
    # the secret may also occur in the words around it ("machin" in "machine"): those may stay, the one planted not
    assert redact(line).count(secret) <= max(0, line.count(secret) - 1), line
    assert "\n" not in redact(line)


@pytest.mark.parametrize("line", [
    "step 120/120 | epoch 3 | loss 0.3128 | 12,345 tokens/s | lr 3.00e-04",
    '{"step": 4, "tokens_per_s": 1234.5, "loss": 2.1}',
    "Run directory: runs/gpt2-20261127 ('make report' draws its curves into report.html there)",
    "note: CONFIG_PAD_VOCAB=y: the vocabulary padded to 50304",
    "https://github.com/pytorch/pytorch and postgresql://user@host/db",
])
def test_ordinary_lines_pass_untouched(line):
    assert redact(line) == line


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=3000))
def test_a_shown_value_is_one_bounded_line(value):
    out = shown(value, limit=120)
    assert "\n" not in out and "\r" not in out and "\0" not in out and "\ufeff" not in out
    assert not any(unicodedata.category(c) in HIDDEN for c in out), ascii(out)
    assert len(out) <= 120 * 10 + 40  # each character escaped at most to \U000NNNNN, plus the note


HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
# every character no message may show as itself: control (C0, DEL, C1), format (U+200B zero-width space, U+202E
# right-to-left override, U+2066 isolates, a BOM, plane 14's tags), lone surrogates, line and paragraph separators
hidden_chars = st.characters(categories=HIDDEN)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=20), hidden_chars, st.text(max_size=20))
def test_every_control_and_format_character_is_shown_escaped(before, hidden, after):
    """A zero-width space or a right-to-left override in a value is shown as \\u200b or \\u202e, visible,
    wherever it sits: in `shown`, and in an error line (which escapes the whole message)."""
    from lib.cli.common import error_line
    from lib.redact import escaped

    code = ord(hidden)
    seen = ({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}.get(hidden)
            or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
    for out in (shown(before + hidden + after, limit=100), escaped(before + hidden + after),
                error_line(f"GPU={before}{hidden}{after} is not a catalog key")):
        assert seen in out and not any(unicodedata.category(c) in HIDDEN for c in out), ascii(out)
    assert escaped("NVIDIA H100 80GB\u00a0HBM3 \u00e9\u4e2d") == "NVIDIA H100 80GB\u00a0HBM3 \u00e9\u4e2d"  # visible: as it is


def test_a_stream_redacts_a_secret_split_across_writes():
    import io

    sink = io.StringIO()
    stream = RedactingStream(sink)
    for piece in ("connecting to postgresql://u:hun", "ter2@db/x\n", "progress 10%\r", "done"):
        stream.write(piece)
    stream.flush()
    assert "hunter2" not in sink.getvalue() and sink.getvalue().endswith("progress 10%\rdone")


def test_a_credentials_file_given_as_a_fragment_is_not_echoed(tmp_path, kfit_here):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.example.com\n  login me\n  password hunter2secret\n")
    done = kfit_here(tmp_path, "plan", KCONFIG_CONFIG=str(netrc))
    assert done.returncode == 2
    assert "hunter2secret" not in done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "is not a config file" in line


def test_a_tracker_url_with_a_password_is_never_printed(tmp_path, kfit_here, monkeypatch):
    from lib import config as kc

    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_TRACK_MLFLOW=y\n'
                        "CONFIG_MAX_STEPS=1\n")
    kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config")
    done = kfit_here(tmp_path, "train", MLFLOW_TRACKING_URI="nosuch://admin:Pa55w0rdXYZ@mlflow.example/x?token=T0k3nXYZ")
    assert done.returncode == 2, done.stdout + done.stderr
    everything = done.stdout + done.stderr
    assert "Pa55w0rdXYZ" not in everything and "T0k3nXYZ" not in everything
    assert "CONFIG_TRACK_MLFLOW=y" in done.stderr


@pytest.mark.parametrize("variable, value, words", [
    ("GPUS", "3000000", "GPUS='3000000' is too large: give a whole number from 1 to 4,096"),
    ("GPUS", "1" + "0" * 20, "is too large"), ("NNODES", "99999999", "is out of range"),
    ("MAX_TOKENS", "5000000000", "MAX_TOKENS='5000000000' is too large"),
    ("GPUS", "x" * 10_000_000, "more characters)' is not a number"),
    ("GPUS", "2\nerror: forged", "GPUS='2\\nerror: forged' is not a number"),
])
def test_a_count_beyond_any_machine_is_refused_at_once_and_quoted_safely(tmp_path, kfit_here, variable, value, words):
    import time

    start = time.perf_counter()
    done = kfit_here(tmp_path, "sample" if variable == "MAX_TOKENS" else "plan", **{variable: value})
    assert done.returncode == 2 and time.perf_counter() - start < 30
    lines = (done.stdout + done.stderr).splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and words in errors[0] and len(errors[0]) < 1000, errors
    assert not any(line.startswith("error: forged") for line in lines)


def test_a_value_given_with_a_config_lines_quotes_is_the_value_inside():
    from lib import config as kc

    base = kc.defconfig_config("lenet5")
    assert kc.derive(base, {"OUTPUT_DIR": '"runs/x"'}).output_dir == "runs/x"  # not a directory named "runs/x"
    assert kc.derive(base, {"OUTPUT_DIR": 'runs/"x"'}).output_dir == 'runs/"x"'  # inner quotes are the user's
    with pytest.raises(kc.ConfigError if hasattr(kc, "ConfigError") else Exception, match="line break or a NUL"):
        kc.derive(base, {"OUTPUT_DIR": "runs\nCONFIG_EPOCHS=1"})


# what each pattern's scan starts on or runs through, alone and in pairs: a line of them is what made the
# user:password pattern scan to the line's end from every letter (100 KB of one word took a minute)
PIECES = ["a", "1", ".", "-", "+", "_", ":", "/", "://", "@", "?", "&", ";", "=", "password", "token=", "key=",
          " ", "a://b:", "\"", "'", "%"]


def test_redaction_takes_time_in_proportion_to_the_line(tmp_path):
    """Lines of 200,000 characters of each piece, and of 20,000 of each pair of pieces, are redacted in one
    pass each: a pattern whose time grows with the square of the line takes many minutes over them (200,000
    letters alone took about two), so the child's limit of 240 s only catches that."""
    import subprocess
    import sys

    script = (
        "import itertools, sys\n"
        "from lib.redact import redact\n"
        f"pieces = {PIECES!r}\n"
        "for unit, size in itertools.chain(((p, 200_000) for p in pieces),\n"
        "                                   ((a + b, 20_000) for a, b in itertools.combinations(pieces, 2))):\n"
        "    redact(unit * (size // len(unit)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["ConfigError", "PlanError", "HardwareError", "DataError", "KfitError"]),
       head=st.text(max_size=50), size=st.integers(0, 300_000), tail=st.text(max_size=50))
def test_an_error_quoting_a_huge_value_is_cut_however_it_is_shown(kind, head, size, tail):
    """A script's traceback, a log or the CLI's line: a KfitError's message keeps its start (what is wrong) and
    its end (the fix) and says how much it cut, so a value of megabytes (model_type=, a path) is never echoed
    whole by the Python API either."""
    from lib import errors

    message = f"{head}value={'A' * size!r}: {tail}"
    text = str(getattr(errors, kind)(message))
    assert len(text) <= errors.MESSAGE_LIMIT + 40
    assert text == message or (text.startswith(message[:400]) and text.endswith(message[-400:])
                               and f"({len(message) - 800:,} characters cut)" in text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet=st.characters(codec="utf-8"), max_size=12), hidden_chars,
                          st.sampled_from(["\n", "\t", "\x1b[2J", "\x1b]0;title\x07", "\u202e"])), max_size=12))
def test_sample_text_keeps_its_lines_and_tabs_and_shows_every_other_control(pieces):
    """make sample prints a model's output as text: line breaks and tabs stay what they are; an escape code, a
    right-to-left override or a lone surrogate (a model trained on any bytes may emit them) is shown escaped."""
    from lib.redact import visible_text

    text = "".join(pieces)
    out = visible_text(text)
    assert out.count("\n") == text.count("\n") and out.count("\t") == text.count("\t")
    assert not any(unicodedata.category(c) in HIDDEN for c in out.replace("\n", "").replace("\t", "")), ascii(out)
    assert visible_text("a\tb\nc") == "a\tb\nc" and visible_text("x\x1b[31my") == "x\\x1b[31my"


@settings(max_examples=200, deadline=None)
@given(user=st.from_regex(r"[A-Za-z_][\w.+-]{0,12}", fullmatch=True),
       password=st.from_regex(r"[A-Za-z0-9!$%^&*()=+~._-]{4,24}", fullmatch=True).filter(lambda p: "***" not in p),
       host=st.sampled_from(["127.0.0.1:9/db", "db.example.org:5432/kfit", "[::1]:5432", "host/db", "h"]),
       form=st.sampled_from(["{u}:{p}@{h}", "HPO: study s in {u}:{p}@{h}", "error: HPO_STORAGE='{u}:{p}@{h}' refused",
                             "Authorization: Bearer {p}", "curl -H 'authorization: basic {p}' x", "bearer {p} ok"]))
def test_credentials_without_a_scheme_or_in_a_header_are_hidden(user, password, host, form):
    """HPO_STORAGE='user:pw@127.0.0.1:9/db' (no postgresql://) printed its password in the HPO line and the error
    line, and a fragment's 'Authorization: Bearer ...' was echoed (an audit)."""
    line = form.format(u=user, p=password, h=host)
    assume(password not in form.format(u=user, p="", h=host))  # the password is nothing else in the line
    assert password not in redact(line), (line, redact(line))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60))
def test_what_kfit_prints_holds_no_character_that_can_forge_or_recolour_a_line(text):
    """Every line kfit prints passes RedactingStream: a value holding ESC, a carriage return inside a line, a
    BOM or a right-to-left override (a path, a link's target) is shown escaped (an audit: OUTPUT_DIR=$'runs\\e[31m'
    coloured the 'Run directory:' line, KCONFIG_CONFIG=$'x\\rFORGED: ok' overwrote the 'No ... found' one).
    Kept: line breaks, tabs, a carriage return that starts a piece and the erase-to-end-of-line sequence (a
    progress line redrawn)."""
    import io
    import unicodedata

    from lib.redact import RedactingStream

    out = io.StringIO()
    stream = RedactingStream(out)
    stream.write("\r\x1b[Kstatus")  # kfit's own status line
    stream.write(f"\nRun directory: {text}\n")
    stream.flush()
    printed = out.getvalue()
    assert printed.startswith("\r\x1b[Kstatus\nRun directory: ")
    rest = printed[len("\r\x1b[Kstatus\n"):]
    for c in rest:
        assert c in "\n\t" or c.isprintable() or c == " " or unicodedata.category(c) not in (
            "Cc", "Cf", "Cs", "Zl", "Zp"), (c, printed)
    assert rest.count("\n") == 1 + text.count("\n")  # a value's line break is its message's to escape (shown)


@settings(max_examples=100, deadline=None)
@given(secret=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="@/:?#&%\\\"' "),
                      min_size=8, max_size=300), limit=st.integers(20, 250))
def test_a_message_cut_to_its_length_is_redacted_first(secret, limit):
    """A tracker's error quoting http://alice:<a 190-character password>@host was cut to 200 characters before
    the redaction, which then found no @ and showed 170 characters of the password (an audit)."""
    assume("***" not in secret)
    text = f"could not reach http://alice:{secret}@127.0.0.1:9/ (refused)"
    assert secret not in shown(text, limit) and f"alice:{secret[:4]}" not in shown(text, limit)


@pytest.mark.parametrize("name", ["X-Amz-Signature", "X-Goog-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                                  "sig", "api-key"])
def test_a_signed_urls_signature_and_credential_are_hidden(name):
    assert "S3cretPWxyz" not in redact(f"GET http://127.0.0.1:9/o?a=1&{name}=S3cretPWxyz&b=2 failed")
    assert redact("http://h/?monkey=1&turkey=2") == "http://h/?monkey=1&turkey=2"  # not a key's name
