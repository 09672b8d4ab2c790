"""The installable package (pyproject.toml, setup.py): the wheel holds lib/ as `kfit`, with its templates,
the digits, the Kconfig tree and the defconfigs, a `kfit` command, and no top-level `lib`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lib import resources

ROOT = Path(__file__).resolve().parent.parent
# What the build reads (MANIFEST.in's list); the build runs on a copy, so the checkout gets no build/.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "requirements.txt", "requirements-torch.txt",
           "Kconfig", "kconfigs", "defconfigs", "lib")


def _setuptools_here() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 64


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copyfile
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is
                                         shutil.copytree else {}))
    # Offline with the setuptools at hand; else pip fetches pyproject.toml's build requirement.
    isolation = ["--no-build-isolation"] if _setuptools_here() else []
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("kfit-*.whl")
    return zipfile.ZipFile(path)


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()
            and "__pycache__" not in p.parts}


def test_the_wheel_holds_the_package_and_its_data(wheel):
    names = set(wheel.namelist())
    top = {n.split("/")[0] for n in names}
    assert top == {"kfit", next(t for t in top if t.endswith(".dist-info"))}, top  # no lib/, no stray data
    code = {f"kfit/{f}" for f in _files(ROOT / "lib") if f.endswith(".py") and not f.startswith("_data/")}
    assert code - names == set(), "modules missing from the wheel"
    for data in ("templates/plan_report.html.j2", "templates/lr_finder.html.j2", "templates/recommend.html.j2",
                 "data/digits.csv.gz", "hardware/gpus.json"):
        assert f"kfit/{data}" in names
    tree = {f"kfit/_data/{name}/{f}" for name in ("kconfigs", "defconfigs") for f in _files(ROOT / name)}
    assert tree and tree | {"kfit/_data/Kconfig"} <= names, sorted(tree - names)
    assert "kfit/_data/defconfigs/fragments/cpu-smoke" in names
    assert wheel.read("kfit/_data/Kconfig") == (ROOT / "Kconfig").read_bytes()


def test_the_wheel_declares_the_command_and_the_dependencies(wheel):
    dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "kfit = kfit.cli:main" in entry_points
    requires = [line.split(":", 1)[1].strip() for line in wheel.read(f"{dist_info}/METADATA").decode().splitlines()
                if line.startswith("Requires-Dist:")]
    for name in ("torch", "numpy", "kconfiglib", "psutil", "jinja2", "nvidia-ml-py", "tqdm", "optuna", "sqlalchemy"):
        assert any(r.lower().startswith(name) and any(op in r for op in (">=", "==")) for r in requires), (name,
                                                                                                       requires)
    assert not any(r.lower().startswith(("scikit-learn", "pynvml")) for r in requires), requires


def test_an_installed_package_reads_its_own_copy_of_the_tree(tmp_path, monkeypatch):
    """kfit/_data/ (a built package) wins over a checkout; a checkout is read in place; neither is an error."""
    data = tmp_path / "kfit" / "_data"
    data.mkdir(parents=True)
    (data / "Kconfig").write_text("")
    monkeypatch.setattr(resources, "PACKAGED_DATA", data)
    assert resources.data_root() == data
    monkeypatch.setattr(resources, "PACKAGED_DATA", tmp_path / "none")
    assert resources.data_root() == ROOT == resources.CHECKOUT
    monkeypatch.setattr(resources, "CHECKOUT", None)
    with pytest.raises(FileNotFoundError, match="Kconfig tree is missing"):
        resources.data_root()
