"""Loaded by every Python process a test starts with this directory on PYTHONPATH (torchrun's ranks too).
Production code has no such hooks: these wrap kfit's modules as they are imported.

KFIT_TEST_RESOLVE_LOG=<file>: each resolve of a plan appends "<pid> <model> world_size=<n>" there, so a test
counts the plans a launch makes (the resolver is wrapped before the one door, lib/planning/door.py, binds it).

KFIT_TEST_ENV_LOG=<file>: each rank of a torchrun job (LOCAL_RANK set when it starts) appends, as it exits, one
JSON line: the names in its environment at start, and every variable kfit asked lib/env.py for."""

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys

RESOLVE_LOG = os.environ.get("KFIT_TEST_RESOLVE_LOG")
ENV_LOG = os.environ.get("KFIT_TEST_ENV_LOG") if "LOCAL_RANK" in os.environ else None
_read: list[str] = []


def _wrap_resolver(module) -> None:
    inner = module.resolve_request

    def resolve_request(request):
        with open(RESOLVE_LOG, "a") as log:
            log.write(f"{os.getpid()} {request.config.model} world_size={request.world_size}\n")
        return inner(request)

    module.resolve_request = resolve_request


def _wrap_env(module) -> None:
    inner = module._get

    def _get(name, env):
        _read.append(name)
        return inner(name, env)

    module._get = _get


def _write_env_log(start: list[str]) -> None:
    with open(ENV_LOG, "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "environment": start, "read": sorted(set(_read))}) + "\n")


WRAP = {**({"lib.planning.resolver": _wrap_resolver} if RESOLVE_LOG else {}),
        **({"lib.env": _wrap_env} if ENV_LOG else {})}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in WRAP:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module, wrap=WRAP[name]):
            run(module)
            wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if WRAP:
    sys.meta_path.insert(0, _Finder())
if ENV_LOG:
    atexit.register(_write_env_log, sorted(os.environ))
