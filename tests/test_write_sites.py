"""Every file kfit writes goes through one layer (lib/fileio.py): atomic, never through a planted link, never
over a device, FIFO or directory. The AST of lib/ is walked for the calls that write a file; each must be in
fileio itself or in WRITES_ELSEWHERE, where a reason says why it is safe (a private temporary directory,
write_atomic's own temporary file). A new write that bypasses the layer fails here.

Then the layer's promises are checked with planted links and special files at the paths the writers take."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from lib import fileio
from lib.errors import KfitError

ROOT = Path(__file__).resolve().parent.parent

# file -> (how many write calls it may hold, why each is safe)
WRITES_ELSEWHERE = {
    "lib/fileio.py": (None, "the layer itself"),
    "lib/checkpoint.py": (5, "torch.save into a BytesIO buffer write_atomic then writes; DCP's own save into "
                             "a fresh temporary directory, swapped into place by two os.replace of names kfit "
                             "made in the run directory it holds locked; a damaged checkpoint renamed aside "
                             "there (os.rename moves a link itself, never its target)"),
    "lib/data/tokenized.py": (1, "write_atomic's callable filling write_atomic's own temporary file"),
    "lib/config/operations.py": (3, "the base and the change, and savedefconfig's text, in a private "
                                    "TemporaryDirectory"),
    "lib/config/kconfig.py": (2, "kconfiglib writes into a private TemporaryDirectory (config_text), and into "
                                 "write_atomic's own temporary file (write_config)"),
    "lib/config/generate.py": (1, "a draft in a private TemporaryDirectory, written over only if it reads back"),
    "lib/sample.py": (1, "a config in a private TemporaryDirectory"),
    "lib/report.py": (1, "a fragment in a private TemporaryDirectory"),
    "lib/memory/measured.py": (5, "a case's files in a private TemporaryDirectory and its child's result there; "
                                  "stderr pointed at os.devnull"),
    "lib/memory/sharded_process.py": (1, "a rank's result in its launcher's private TemporaryDirectory"),
    "lib/validation/steptime_check.py": (2, "copies into a private TemporaryDirectory"),
    "lib/cli/train.py": (1, "the launcher's plan in a mkstemp file (O_EXCL, 0600) it removes"),
    "lib/export.py": (1, "DCP's consolidation into a private TemporaryDirectory"),
}
WRITERS = {"write_text", "write_bytes", "copyfile", "copy", "copy2", "copytree", "save", "dump", "replace", "rename",
           "dcp_to_torch_save", "save_file", "write_config", "write_min_config"}  # the last two: kconfiglib's


def write_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls that write a file: Path.write_text/bytes, open(..., 'w'/'a'/'x'/'+'), shutil's copies, torch.save
    and json.dump to a file, os.replace/rename, and safetensors' and DCP's savers."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name == "open" and not isinstance(func, ast.Attribute):
            modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
            if any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+")
                   for m in modes):
                found.append(node)
        elif name in WRITERS:
            if not isinstance(func, ast.Attribute):
                if name in ("dcp_to_torch_save", "save_file"):
                    found.append(node)
                continue  # another bare name: fileio's own write_text / copy_file, imported by name
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner == "fileio":
                continue
            if name in ("save", "dump") and owner not in ("torch", "json", "dcp", "pickle"):
                continue  # an object's own save (a tokenizer's, a study's) is not a file write of kfit's
            if name in ("replace", "rename") and owner != "os":
                continue  # str.replace, Path.rename is caught below
            if name == "copy" and owner != "shutil":
                continue
            found.append(node)
    return found


def bypassing(calls_of, allowed: dict) -> tuple[list[str], list[str]]:
    """(call sites in lib/ that `allowed` does not account for, files `allowed` grants more calls than they
    hold): the walk both layer tests share."""
    unexpected, counts = [], {}
    for path in sorted((ROOT / "lib").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        calls = calls_of(ast.parse(path.read_text()))
        if calls:
            counts[rel] = len(calls)
            limit = allowed.get(rel)
            if limit is None or (limit[0] is not None and len(calls) > limit[0]):
                unexpected += [f"{rel}:{c.lineno}" for c in calls]
    return unexpected, [rel for rel, (n, _) in allowed.items() if n is not None and counts.get(rel, 0) < n]


def test_every_write_in_lib_goes_through_the_file_layer():
    unexpected, stale = bypassing(write_calls, WRITES_ELSEWHERE)
    assert not unexpected, ("writes that bypass lib/fileio.py (use write_atomic, write_text, write_json_atomic, "
                            f"copy_file or open_append): {unexpected}")
    assert not stale, f"WRITES_ELSEWHERE allows more writes than these files hold (lower the counts): {stale}"


# file -> (how many direct reads it may hold, why each is safe): a read outside fileio.read_bytes / read_text
# opens what is there, and a FIFO planted in a run or data directory blocked kfit for ever (a corpus's meta.json)
READS_ELSEWHERE = {
    "lib/fileio.py": (None, "the layer itself"),
    "lib/__init__.py": (1, "the checkout's own pyproject.toml"),
    "lib/cli/__init__.py": (1, "the checkout's own options.pyi"),
    "lib/checkpoint.py": (3, "torch.load and zipfile of a checkpoint the resume search found a regular file"),
    "lib/config/kconfig.py": (2, "a config checked a regular file first (require_config_file); kconfiglib's own "
                                 "output in a private TemporaryDirectory"),
    "lib/config/operations.py": (4, "a config checked a regular file first (require_config_file, _same_bytes' "
                                    "is_file); kconfiglib's output in a private TemporaryDirectory"),
    "lib/data/text.py": (1, "np.fromfile of a token file read_bin checked a regular file first"),
    "lib/data/tokenized.py": (1, "np.fromfile of the shards make data wrote in its own .shards directory"),
    "lib/export.py": (1, "torch.load of DCP's consolidation in a private TemporaryDirectory"),
    "lib/hardware/catalog.py": (1, "the checkout's own GPU catalog"),
    "lib/hardware/details.py": (1, "a /sys file of the kernel's"),
    "lib/memory/cache.py": (1, "kfit's own source files, hashed"),
    "lib/steptime/count.py": (1, "kfit's own source files, hashed"),
    "lib/memory/measured.py": (2, "a child's result in a private TemporaryDirectory"),
    "lib/randcheck.py": (2, "a run randcheck made in its own TemporaryDirectory"),
    "lib/trainer/resume.py": (1, "the config file the user named, already read by the strict reader"),
    "lib/trainer/rundir.py": (2, "a tokenizer checked a regular file first (corpus_tokenizer, is_file and not a "
                                 "link)"),
    **{f"lib/validation/{name}": (n, "a validation run's own output in its OUT directory or a temporary one")
       for name, n in (("budget.py", 2), ("fsdp_check.py", 2), ("measure.py", 1), ("report.py", 1),
                       ("steptime_check.py", 1), ("torchrun.py", 1))},
}


def read_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls that open a file to read it: Path.read_text/read_bytes (not fileio's), np.fromfile/memmap,
    zipfile.ZipFile, torch.load."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            if node.func.attr in ("read_text", "read_bytes") and owner != "fileio" or \
                    (owner, node.func.attr) in (("np", "fromfile"), ("np", "memmap"), ("zipfile", "ZipFile"),
                                                ("torch", "load")):
                found.append(node)
    return found


def test_every_read_in_lib_goes_through_the_file_layer_or_says_why_not():
    unexpected, stale = bypassing(read_calls, READS_ELSEWHERE)
    assert not unexpected, f"reads that bypass lib/fileio.py (use fileio.read_bytes or read_text): {unexpected}"
    assert not stale, f"READS_ELSEWHERE allows more reads than these files hold (lower the counts): {stale}"


# -- the layer's promises, at generated paths with generated things planted there -------------------------------

def plant(kind: str, path: Path, elsewhere: Path) -> None:
    """A link (to a file, to nothing, to a directory), a FIFO, a directory or a socket-like special file."""
    if kind == "link-to-file":
        elsewhere.write_text("keep me\n")
        path.symlink_to(elsewhere)
    elif kind == "dangling-link":
        path.symlink_to(elsewhere)
    elif kind == "link-to-dir":
        elsewhere.mkdir()
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()


KINDS = ("link-to-file", "dangling-link", "link-to-dir", "fifo", "directory")
WRITERS_UNDER_TEST = {
    "write_atomic": lambda p: fileio.write_atomic(p, b"new\n"),
    "write_text": lambda p: fileio.write_text(p, "new\n"),
    "write_json_atomic": lambda p: fileio.write_json_atomic(p, {"a": 1}),
    "copy_file": lambda p: fileio.copy_file(p.parent.parent / "source", p),
    "open_append": lambda p: fileio.open_append(p).close(),
}


def snapshot(directory: Path) -> dict:
    out = {}
    for p in sorted(directory.rglob("*")):
        st_ = os.lstat(p)
        out[p.relative_to(directory).as_posix()] = (
            stat.S_IFMT(st_.st_mode), os.readlink(p) if p.is_symlink() else
            p.read_bytes() if stat.S_ISREG(st_.st_mode) else None)
    return out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KINDS), st.sampled_from(sorted(WRITERS_UNDER_TEST)),
       st.text(alphabet="abcxyz._-", min_size=1, max_size=12).filter(lambda n: n not in (".", "..")))
def test_no_writer_follows_a_planted_link_or_replaces_a_special_file(tmp_path_factory, kind, writer, name):
    base = tmp_path_factory.mktemp("planted")
    (base / "source").write_text("copy me\n")
    target, elsewhere = base / "run" / name, base / "elsewhere"
    target.parent.mkdir()
    plant(kind, target, elsewhere)
    before = snapshot(base)
    with pytest.raises(fileio.UnsafeFileError) as refused:
        WRITERS_UNDER_TEST[writer](target)
    assert str(target) in str(refused.value) and "\n" not in str(refused.value)
    assert snapshot(base) == before  # nothing written anywhere, the planted thing as it was


@pytest.mark.parametrize("kind", ["fifo", "directory", "link-to-dir"])
def test_a_config_named_by_the_user_is_written_through_its_link_but_never_over_a_special_file(tmp_path, kind):
    from lib import config as kc

    kept = tmp_path / "kept.config"
    kc.make_defconfig("lenet5", out=kept)
    linked = tmp_path / ".config"
    linked.symlink_to(kept)
    kc.make_defconfig("gpt2-tiny", out=linked)  # a documented feature: the link stays, its target is replaced
    assert linked.is_symlink() and "CONFIG_MODEL_GPT2=y" in kept.read_text()
    assert not (tmp_path / "kept.config.old").exists() and (tmp_path / ".config.old").is_file()
    assert not (tmp_path / ".config.old").is_symlink()

    special = tmp_path / "special"
    plant(kind, special, tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    with pytest.raises(KfitError):  # one error line (a directory: ConfigError; else UnsafeFileError)
        kc.make_defconfig("lenet5", out=special)
    assert snapshot(tmp_path) == before


@settings(max_examples=15, deadline=None)
@given(depth=st.integers(1, 4))
def test_a_dangling_config_link_never_makes_directories(tmp_path_factory, depth):
    """A .config linked to a file not made yet is written there (a kept config being started), but a link into
    directories that do not exist was followed and the directories made (an audit: /tmp/victim/newdir/sub)."""
    from lib import config as kc

    tmp = tmp_path_factory.mktemp("dangling")
    victim = tmp / "victim"
    victim.mkdir()
    deep = victim.joinpath(*[f"d{i}" for i in range(depth)], "cfg")
    linked = tmp / ".config"
    linked.symlink_to(deep)
    with pytest.raises(KfitError, match="whose directory does not exist"):
        kc.make_defconfig("lenet5", out=linked)
    assert list(victim.iterdir()) == [] and linked.is_symlink()
    shallow = tmp / ".config2"
    shallow.symlink_to(victim / "cfg")  # its directory is there: the link is the user's, written through
    kc.make_defconfig("lenet5", out=shallow)
    assert (victim / "cfg").is_file() and shallow.is_symlink()


def test_the_old_copy_is_never_written_through_a_link(tmp_path):
    from lib import config as kc

    config = tmp_path / ".config"
    kc.make_defconfig("lenet5", out=config)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / ".config.old").symlink_to(victim)
    with pytest.raises(fileio.UnsafeFileError, match=r"\.config\.old is a symbolic link"):
        kc.make_defconfig("gpt2-tiny", out=config)
    assert victim.read_text() == "precious\n" and "CONFIG_MODEL_LENET5=y" in config.read_text()


# -- the writers of a run, its export and its report, with links planted where they write ----------------------

@pytest.fixture
def trained(tmp_path, make_config, one_thread):
    from tests.helpers import run

    config = make_config("CONFIG_MAX_STEPS=2\nCONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=32\n"
                         "CONFIG_GRADIENT_ACCUMULATION=1\n")
    _, result = run(config)
    return config, result.run_dir


def test_a_run_name_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, trained):
    from lib import config as kc
    from tests.helpers import run

    config, _ = trained
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "runs" / "mine").symlink_to(elsewhere)
    with pytest.raises(KfitError, match=r"mine is a symbolic link"):  # every rank refuses alike
        run(kc.derive(config, {"RUN_NAME": "mine"}))
    assert not any(elsewhere.iterdir())


def test_export_and_report_never_write_through_a_link_in_out(tmp_path, trained):
    from lib.export import MODEL_FILE, export
    from lib.run_report import write_report

    _, run_dir = trained
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / MODEL_FILE).symlink_to(victim)
    with pytest.raises(fileio.UnsafeFileError, match=MODEL_FILE):
        export(run_dir, out)
    page = tmp_path / "page.html"
    page.symlink_to(victim)
    with pytest.raises(fileio.UnsafeFileError, match="page.html is a symbolic link"):
        write_report(run_dir, page)
    os.mkfifo(tmp_path / "fifo.html")
    with pytest.raises(fileio.UnsafeFileError, match="fifo.html is not a regular file"):
        write_report(run_dir, tmp_path / "fifo.html")
    assert victim.read_text() == "precious\n"
    for name in ("config", "plan.json"):  # planted after the model file: refused before anything is written
        for kind in ("link-to-file", "fifo", "directory", "dangling-link"):
            planted = tmp_path / f"out-{name}-{kind}"
            planted.mkdir()
            plant(kind, planted / name, tmp_path / f"elsewhere-{name}-{kind}")
            before = snapshot(planted)
            with pytest.raises(fileio.UnsafeFileError, match=name):
                export(run_dir, planted)
            assert snapshot(planted) == before, (name, kind)


@pytest.mark.parametrize("reader", ["read_meta", "recorded_hash", "run_model", "files.read_bytes", "read_txt"])
def test_a_fifo_planted_where_kfit_reads_never_blocks(tmp_path, reader):
    """A FIFO named meta.json in a corpus directory hung `make train` (found by an audit): every reader of a
    file in a data or run directory is refused or answers at once."""
    import signal

    from lib import runs
    from lib.data import files, run_tokenizer, text
    from lib.errors import KfitError

    name = {"read_meta": "meta.json", "recorded_hash": run_tokenizer.HASH_FILE, "run_model": "config",
            "files.read_bytes": "corpus.txt", "read_txt": "corpus.txt"}[reader]
    fifo = tmp_path / name
    os.mkfifo(fifo)
    call = {"read_meta": lambda: text.read_meta(tmp_path), "recorded_hash": lambda: run_tokenizer.recorded_hash(tmp_path),
            "run_model": lambda: runs.run_model(tmp_path), "files.read_bytes": lambda: files.read_bytes(fifo),
            "read_txt": lambda: text.read_txt(tmp_path, [fifo])}[reader]
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"{reader} blocked on a FIFO"))
    signal.alarm(10)
    try:
        try:
            assert call() is None  # the readers that answer "nothing recorded here"
        except KfitError as err:
            assert "\n" not in str(err) and "FIFO" in str(err), str(err)
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("cache", ["memory", "steptime"])
def test_a_cache_root_planted_as_a_link_takes_no_write(tmp_path, monkeypatch, cache):
    """KFIT_CACHE_DIR=/tmp/c2 where /tmp/c2 was planted as a link: the trace and timing caches made their
    directories in the link's target (an audit); now no write lands there, and a plan only costs time."""
    from lib.memory import cache as memory_cache
    from lib.steptime import cache as steptime_cache

    victim = tmp_path / "victim"
    victim.mkdir()
    root = tmp_path / "c2"
    root.symlink_to(victim)
    monkeypatch.setenv("KFIT_CACHE_DIR", str(root))
    target = root / cache / "entry.json"
    if cache == "memory":
        memory_cache.write_traces(target, {"key": {}, "traces": {}})
    else:
        steptime_cache.write_json(target, {})
    assert list(victim.iterdir()) == []


def test_a_fifo_or_link_planted_as_a_checkpoint_is_named_and_passed_by(tmp_path):
    """A FIFO named checkpoint-4.pt hung the resume in the integrity check (an audit), and a link was read
    through and called "probably cut short by a crash": each is named in one warning and passed by."""
    import signal

    from lib import checkpoint

    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"not a zip")
    os.mkfifo(tmp_path / "checkpoint-4.pt")
    (tmp_path / "checkpoint-3.pt").symlink_to(victim)
    warnings = []
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the checkpoint search blocked on a FIFO"))
    signal.alarm(10)
    try:
        assert checkpoint.latest_valid(tmp_path, log=warnings.append) is None
    finally:
        signal.alarm(0)
    assert len(warnings) == 2 and "FIFO" in warnings[0] and "symbolic link" in warnings[1], warnings
    assert "cut short" not in " ".join(warnings) and victim.read_bytes() == b"not a zip"
