"""Loaded by every Python process a test starts with this directory on PYTHONPATH (torchrun's ranks too):
with KFIT_TEST_RESOLVE_LOG=<file>, each resolve of a plan appends "<pid> <model> world_size=<n>" there, so a
test counts the plans a launch makes. Production code has no such hook: this wraps the resolver as it is
imported, before the one door (lib/planning/door.py) binds it."""

import importlib.abc
import importlib.util
import os
import sys

LOG = os.environ.get("KFIT_TEST_RESOLVE_LOG")
TARGET = "lib.planning.resolver"


def _wrap(module) -> None:
    inner = module.resolve_request

    def resolve_request(request):
        with open(LOG, "a") as log:
            log.write(f"{os.getpid()} {request.config.model} world_size={request.world_size}\n")
        return inner(request)

    module.resolve_request = resolve_request


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
