"""The GPU catalog's figures live in lib/hardware/gpus.json; catalog.py reads them strictly: a missing,
extra or mistyped field is an error that names the file, the entry and the field."""

from __future__ import annotations

import copy
import json

import pytest

from lib.errors import HardwareError
from lib.hardware import catalog


@pytest.fixture
def write(tmp_path):
    good = json.loads(catalog.DATA_FILE.read_text())

    def write(change) -> object:
        data = copy.deepcopy(good)
        change(data)
        path = tmp_path / "gpus.json"
        path.write_text(json.dumps(data))
        return path

    return write


def test_the_shipped_file_is_the_catalog():
    assert catalog.load_entries() == tuple(catalog.CATALOG.values())
    assert {e.vendor for e in catalog.CATALOG.values()} == {"nvidia", "amd"}
    h100 = catalog.CATALOG["h100"]
    assert (h100.backend, h100.arch, h100.compute_capability, h100.bf16) == ("cuda", "sm_90", (9, 0), True)
    assert (catalog.CATALOG["v100"].bf16, catalog.CATALOG["mi300x"].compute_capability) == (False, None)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["gpus"][1].pop("tdp_watts"), "entry 1 ('h200'): missing field(s) tdp_watts"),
    (lambda d: d["gpus"][1].update(total_bytes="80GB"), "entry 1 ('h200'): field 'total_bytes' must be an integer"),
    (lambda d: d["gpus"][0].update(tdp_watts=True), "entry 0 ('h100'): field 'tdp_watts' must be an integer"),
    (lambda d: d["gpus"][0]["peak"].update(tf32_tflops="x"), "('h100'), peak: field 'tf32_tflops' must be a number"),
    (lambda d: d["gpus"][0]["peak"].pop("link"), "entry 0 ('h100'), peak: missing field(s) link"),
    (lambda d: d["gpus"][0].update(arch="sm_90"), "entry 0 ('h100'): unknown field(s) arch"),
    (lambda d: d["gpus"][0].update(vendor="intel"), "('h100'): field 'vendor' must be one of nvidia, amd"),
    (lambda d: d["gpus"][2].update(compute_capability=[9]), "('gh200'): field 'compute_capability' must be"),
    (lambda d: d["gpus"][3].update(key="h100"), "entry 'h100' is listed more than once"),
    (lambda d: d["gpus"].__setitem__(0, 3), "entry 0 must be an object"),
    (lambda d: d.pop("gpus"), "'gpus' is a non-empty list"),
])
def test_a_bad_entry_is_an_error_naming_it(write, change, message):
    path = write(change)
    with pytest.raises(HardwareError) as err:
        catalog.load_entries(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)
