"""The parts of the build pyproject.toml cannot say: lib/'s subpackages under the name kfit, and the Kconfig
tree and defconfigs (which live beside lib/ in the checkout) copied into the package as kfit/_data/."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# What lib/resources.py finds as kfit/_data/ when installed (in a checkout it reads them in place).
DATA = ("Kconfig", "kconfigs", "defconfigs")


class build_py_with_data(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own files
            return
        target = Path(self.build_lib) / "kfit" / "_data"
        shutil.rmtree(target, ignore_errors=True)
        for name in DATA:
            source = HERE / name
            if source.is_dir():  # regular files only: symlinks are copied as the files they point to
                shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("*~", ".*", "__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target / name)


setup(packages=["kfit", *(f"kfit.{name}" for name in find_packages(str(HERE / "lib")))],
      cmdclass={"build_py": build_py_with_data})
