"""The step-time caches on disk: versioned, checked field by field on every read, never a traceback.

<cache dir>/steptime/ holds cpu-<key>.json (device.py: this CPU's measured figures), counts-<key>.json
(count.py: a step's counted work), measured-<key>.json (calibrate.py: real micro-batch timings) and
calibration.json (calibrate.py: the last runs' step times per machine and model). Every file carries
"schema": SCHEMA. A file that is damaged (not JSON, not an object, a directory or a link in its place),
of another schema, or whose fields fail the checks below is dropped with one note naming it
(lib.fileio.cache_note) and measured again; a damaged calibration entry drops that entry only.
Writes never follow a link and a read-only cache directory only costs time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from ..fileio import UnsafeFileError, cache_note, is_number, read_json_cache, sweep_temporaries, write_cache_file

SCHEMA = 1
CPU_FIELDS = ("fp32_flops", "bf16_flops", "bandwidth", "op_overhead_s", "conv_flops")  # positive; conv_op_s >= 0
RUN_FIELDS = ("micro_batch", "grad_accum", "samples")  # positive integers; "seconds" a positive number


def read_json(path: Path) -> dict:
    """The cache file's object ({} when missing or dropped with a note), its "schema" key removed."""
    data = read_json_cache(path, SCHEMA)
    if data is None:
        return {}
    data.pop("schema", None)
    return data


def write_json(path: Path, data: dict) -> None:
    """Write atomically with the schema, never through a link; a read-only or refused cache only costs time."""
    try:
        write_cache_file(path, json.dumps({**data, "schema": SCHEMA}, sort_keys=True).encode())
    except UnsafeFileError as err:
        cache_note(path, str(err).split(": kfit")[0], then="not updated")
    except OSError:
        return
    sweep_temporaries(path.parent)


def is_count(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def cpu_figures(path: Path) -> dict | None:
    """cpu-<key>.json's figures when every one is a positive number (threads a positive count), else None
    (noted when the file was there)."""
    figures = read_json(path)
    if not figures and not path.is_file():
        return None
    bad = [k for k in CPU_FIELDS if not is_number(figures.get(k), positive=True)]
    if not (is_number(figures.get("conv_op_s")) and figures["conv_op_s"] >= 0):
        bad.append("conv_op_s")
    if not is_count(figures.get("threads")):
        bad.append("threads")
    if bad:
        cache_note(path, f"missing or invalid {', '.join(bad)}")
        return None
    return figures


def valid_run(run) -> bool:
    """A calibration entry: the plan's split, the median step seconds of one run and the load it ran under
    (other processes' share of the cores; entries from before the load was kept have none: idle)."""
    return (isinstance(run, dict) and all(is_count(run.get(k)) for k in RUN_FIELDS)
            and is_number(run.get("seconds"), positive=True)
            and ("load" not in run or (is_number(run["load"]) and 0 <= run["load"] <= 1)))


def calibration_entries(path: Path) -> dict[str, list[dict]]:
    """calibration.json's runs by key, every damaged entry dropped (one note for the file)."""
    entries = read_json(path)
    clean: dict[str, list[dict]] = {}
    dropped = 0
    for key, runs in entries.items():
        if not isinstance(runs, list):
            dropped += 1
            continue
        good = [r for r in runs if valid_run(r)]
        dropped += len(runs) - len(good)
        if good:
            clean[key] = good
    if dropped:
        cache_note(path, f"{dropped} damaged calibration entr{'y' if dropped == 1 else 'ies'}",
                   then="dropped; the next run calibrates again")
    return clean


class Measured(NamedTuple):
    """measured-<key>.json: real micro-batch timings on this machine (measure.py)."""

    micro: dict[int, float]  # forward+backward seconds by micro-batch
    skipped: set[int]  # sizes the budget left out
    optimizer: dict[int, float]  # the optimizer's seconds by the micro-batch before it
    spread: dict[int, float]  # relative half-width by micro-batch (measure.spreads)
    load: float  # other processes' share of the usable cores while timed (0: idle or unknown)


def measured_timings(path: Path) -> Measured:
    """measured-<key>.json's timings; empty when missing or damaged (noted), so the sizes are timed again."""
    data = read_json(path)
    if not data:
        return Measured({}, set(), {}, {}, 0.0)
    try:
        micro, optimizer = (_by_size(data.get(key, {}), key) for key in ("micro", "optimizer"))
        spread = {int(k): float(v) for k, v in data.get("spread", {}).items() if is_number(v) and v >= 0}
        skipped = data.get("skipped", [])
        if not isinstance(skipped, list) or not all(is_count(s) for s in skipped):
            raise ValueError("skipped is not a list of sizes")
        load = data.get("load", 0.0)
        if not (is_number(load) and 0 <= load <= 1):
            raise ValueError("load is not a share of the cores")
    except (AttributeError, TypeError, ValueError) as err:
        cache_note(path, f"invalid ({err})")
        return Measured({}, set(), {}, {}, 0.0)
    return Measured(micro, set(skipped), optimizer, spread, float(load))


def _by_size(entries: dict, what: str) -> dict[int, float]:
    """{"16": seconds} as {16: seconds}, every size a positive count and every time a positive number."""
    out = {int(k): float(v) for k, v in entries.items() if is_number(v, positive=True)}
    if len(out) != len(entries) or any(k < 1 for k in out):
        raise ValueError(f"a {what} timing that is not a positive number of seconds")
    return out
