"""Seeing plans: make plan's memory lines, check-hardware warnings, the matrix and the HTML report."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib import config as kc
from lib.hardware import catalog, from_catalog, resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.planning import Settings
from lib.planning.render import memory_lines
from lib.report import (
    _breakdown_bar, _breakdown_legend, _peak_curve, format_matrix, hardware_warnings, machines,
    plan_matrix, recommendations, render_report,
)

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
MIB = 2**20


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    return kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("c") / ".config")


@pytest.mark.slow
def test_matrix_covers_every_defconfig_on_every_machine():
    rows = plan_matrix(policy=TierPolicy())  # the tier policy keeps this instant; the planner is below
    keys = {(r.defconfig, r.machine) for r in rows}
    expected = {(d, m) for d in kc.defconfig_names() for m in [*catalog.catalog_keys(), "cpu"]}
    assert keys == expected and len(rows) == len(expected)
    text = format_matrix(rows)
    assert text.splitlines()[0].split()[:3] == ["defconfig", "machine", "micro"]
    assert len(text.splitlines()) == len(rows) + 1


def test_planner_matrix_row_shows_peak_against_budget():
    [row] = plan_matrix(["lenet5"], [m for m in machines() if m[0] == "t4"])
    assert row.plan.policy == "planner" and row.plan.predicted_peak_bytes <= row.plan.budget_bytes
    line = format_matrix([row]).splitlines()[1]
    assert line.startswith("lenet5") and "t4" in line and "GiB" in line and line.endswith("%")


@pytest.mark.slow
def test_a_parallel_matrix_plans_what_one_process_plans_in_the_same_order(capsys):
    """The pool plans this CPU untimed (timings that other workers would disturb): what one process plans
    with timing off, row for row, and progress one line a job, this CPU's jobs named."""
    targets = [m for m in machines() if m[0] in ("t4", "h100", "cpu")]
    names = ["lenet5", "llama-tiny", "gpt2-tiny"]
    untimed = Settings(measure=False)
    serial = plan_matrix(names, targets, settings=untimed)
    capsys.readouterr()
    parallel = plan_matrix(names, targets, jobs=2, settings=Settings(measure=True))
    assert [(r.defconfig, r.machine) for r in parallel] == [(r.defconfig, r.machine) for r in serial]
    for a, b in zip(serial, parallel):
        assert (a.plan.micro_batch, a.plan.grad_accum, a.plan.predicted_peak_bytes, a.plan.cpu_threads) == (
            b.plan.micro_batch, b.plan.grad_accum, b.plan.predicted_peak_bytes, b.plan.cpu_threads), (
                a.defconfig, a.machine)
    err = capsys.readouterr().err
    assert "plan-matrix 6/6: " in err and "on 2 machine(s)" in err and "on this CPU" in err


def test_matrix_progress_goes_to_stderr_and_names_what_is_traced(tmp_path, capsys, monkeypatch):
    import io

    from lib.planning.memory_policy import PlannerPolicy

    policy = PlannerPolicy(cache_dir=str(tmp_path))  # cold: every plan traces
    targets = [m for m in machines() if m[0] in ("t4", "cpu")]
    plan_matrix(["lenet5"], targets, policy)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("plan-matrix 1/2: lenet5 on t4: 2 trace(s) in ")
    assert "plan-matrix 2/2: lenet5 on cpu: " in err
    plan_matrix(["lenet5"], targets, policy)
    assert capsys.readouterr() == ("", "")  # cached plans are instant and say nothing

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    plan_matrix(["lenet5"], targets, policy)
    bar = sys.stderr.getvalue()
    assert "plan-matrix" in bar and "/2 [" in bar and "lenet5 on cpu" in bar


@pytest.mark.slow
def test_report_renders_html_with_svg_charts(tmp_path):
    targets = [m for m in machines() if m[0] in ("t4", "cpu")]
    rows = plan_matrix(["lenet5", "gpt2-tiny"], targets)
    out = render_report(rows, "cpu", tmp_path / "report.html")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 4  # 2 defconfigs x (bar, curve)
    assert "budget" in page and "chosen" in page and "<polyline" in page
    assert "src=" not in page and "href=" not in page  # self-contained
    # The focus machine's column comes first, whatever its name sorts as; sizes are binary, said once.
    assert re.findall(r"<th[^>]*>([\w-]+)", page)[:3] == ["defconfig", "cpu", "t4"]
    assert "1 GiB = 2<sup>30</sup> bytes" in page and "MiB" in page
    assert not re.search(r"\d(\.\d+)?[GM]B\b", page)


def fake_plan(micro: int, peak: int, budget: int, reason: str = "fits", cap: int = 10**6, breakdown=None):
    return SimpleNamespace(micro_batch=micro, predicted_peak_bytes=peak, budget_bytes=budget,
                           max_micro_batch=cap, reasons={"micro_batch": reason}, memory_breakdown=breakdown)


def test_peak_curve_spans_its_own_range_and_notes_a_distant_budget():
    # A 30 MiB model under a 16 GiB budget: against 0..budget it was a flat line at 0.
    points = [(1, 20 * MIB), (64, 30 * MIB), (256, 60 * MIB)]
    g = _peak_curve(points, fake_plan(64, 30 * MIB, 16 * GIB))
    assert g["unit"] == "MiB" and g["budget_y"] is None and "16.00 GiB, above the chart" in g["budget"]
    height = g["bottom"] - g["top"]
    assert min(d["y"] for d in g["dots"]) < g["top"] + 0.2 * height  # the curve reaches the top fifth
    assert g["chosen"]["y"] < g["bottom"] - 0.25 * height  # and the chosen point is clear of the axis
    assert [t["label"] for t in g["yticks"]] == ["0", "20", "40", "60"]  # MiB, read off a round scale


def test_peak_curve_draws_the_budget_when_memory_binds():
    points = [(1, GIB), (16, 9 * GIB), (24, 13 * GIB)]
    plan = fake_plan(25, int(15.7 * GIB), 16 * GIB, "26 would need 16.3GB", cap=25)
    g = _peak_curve(points, plan)
    assert g["unit"] == "GiB" and g["top"] < g["budget_y"] < g["chosen"]["y"] < g["bottom"]
    assert g["budget"] == "16.00 GiB"


def test_breakdown_legend_has_one_order_on_every_card():
    a = fake_plan(1, 10, 20, breakdown={"host_heap": 1, "activations": 5, "parameters": 4})
    b = fake_plan(1, 10, 20, breakdown={"parameters": 4, "workspace": 2, "activations": 4})
    legends = _breakdown_legend([a, b])
    assert [[name for name, _, _ in legend] for legend in legends] == \
        [["parameters", "activations", "workspace", "host_heap"]] * 2
    assert legends[0][2][1] is None and legends[1][2][1] == "0.0 MiB"  # a lacks the workspace
    assert [s["name"] for s in _breakdown_bar(a)["segments"]] == ["parameters", "activations", "host_heap"]


def test_memory_lines_list_the_breakdown(lenet):
    plan = resolve(lenet, resolve_hardware(gpu="a10g"), ModelDescription.from_config(lenet))
    lines = memory_lines(plan)
    assert lines[0].startswith("  memory: predicted peak") and "of the budget" in lines[0]
    assert {line.split()[0] for line in lines[1:]} == set(plan.memory_breakdown)
    tiers = resolve(lenet, resolve_hardware(gpu="a10g"), ModelDescription("lenet5"), policy=TierPolicy())
    assert memory_lines(tiers) == []


def test_hardware_warnings_name_the_problems():
    hw = from_catalog("h100", free_gb=40)
    mixed = dataclasses.replace(hw, gpus=(hw.gpus[0], dataclasses.replace(from_catalog("a10g").gpus[0], index=1)),
                                disk_free_bytes=GIB, on_battery=True)
    text = "\n".join(hardware_warnings(mixed))
    assert "in use" in text and "other processes" in text
    assert "differ" in text and "disk" in text and "battery" in text
    assert hardware_warnings(from_catalog("h100")) == []  # the catalog default leaves only a context


@pytest.mark.slow
def test_recommendations_name_only_memory_profiles_that_change_the_plan(lenet, tmp_path):
    hardware = resolve_hardware(gpu="t4")
    plan = resolve(lenet, hardware, ModelDescription.from_config(lenet))
    assert not any("CONFIG_MEMORY_PROFILE" in a for a in recommendations(lenet, hardware, plan))  # all the same
    gpt2 = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    tight = resolve_hardware(gpu="t4", free_gb=0.4)  # 75% fits the whole share of 64; 50% does not
    plan = resolve(gpt2, tight, ModelDescription.from_config(gpt2))
    [advice] = [a for a in recommendations(gpt2, tight, plan) if "CONFIG_MEMORY_PROFILE" in a]
    assert advice.startswith("CONFIG_MEMORY_PROFILE_CONSERVATIVE (50%): micro-batch") and plan.micro_batch == 64


def test_cli_check_hardware_shows_memory_warnings_and_advice(tmp_path, lenet, monkeypatch, capsys):
    from lib.cli import main

    (tmp_path / ".config").write_text(lenet.text)
    # kfit check-hardware in this process (make runs it with its variables as environment): no interpreter start
    monkeypatch.chdir(tmp_path)
    for name, value in (("KCONFIG_CONFIG", str(tmp_path / ".config")), ("GPU", "t4"), ("FREE_GB", "8")):
        monkeypatch.setenv(name, value)
    for name in ("HW", "GPUS", "WORLD_SIZE", "FORMAT"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    code = main(["check-hardware"])
    hw = subprocess.CompletedProcess(["kfit", "check-hardware"], code, *capsys.readouterr())
    assert hw.returncode == 0, hw.stderr
    assert "policy planner" in hw.stdout and "memory: predicted peak" in hw.stdout
    assert "warning: GPU 0 (Tesla T4)" in hw.stdout
    assert hw.stdout.count("Plan for ") == 1 and "Hyperparams:" not in hw.stdout  # the plan once
