"""Seeing plans: make plan's memory lines, check-hardware warnings, the matrix and the HTML report."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lib import config as kc
from lib.hardware import catalog, from_catalog, resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.report import (
    format_matrix, hardware_warnings, machines, memory_lines, plan_matrix, recommendations, render_report,
)

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    return kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("c") / ".config")


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
    assert line.startswith("lenet5") and "t4" in line and "GB" in line and line.endswith("%")


def test_matrix_progress_goes_to_stderr_and_names_what_is_traced(tmp_path, capsys, monkeypatch):
    import io

    from lib.planner import PlannerPolicy

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


def test_report_renders_html_with_svg_charts(tmp_path):
    targets = [m for m in machines() if m[0] in ("t4", "cpu")]
    rows = plan_matrix(["lenet5", "gpt2-tiny"], targets)
    out = render_report(rows, "t4", tmp_path / "report.html")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 4  # 2 defconfigs x (bar, curve)
    assert "budget" in page and "chosen" in page and "<polyline" in page
    assert "src=" not in page and "href=" not in page  # self-contained


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


def test_recommendations_name_only_memory_profiles_that_change_the_plan(lenet, tmp_path):
    hardware = resolve_hardware(gpu="t4")
    plan = resolve(lenet, hardware, ModelDescription.from_config(lenet))
    assert not any("CONFIG_MEMORY_PROFILE" in a for a in recommendations(lenet, hardware, plan))  # all the same
    gpt2 = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    tight = resolve_hardware(gpu="t4", free_gb=0.4)  # 75% fits the whole share of 64; 50% does not
    plan = resolve(gpt2, tight, ModelDescription.from_config(gpt2))
    [advice] = [a for a in recommendations(gpt2, tight, plan) if "CONFIG_MEMORY_PROFILE" in a]
    assert advice.startswith("CONFIG_MEMORY_PROFILE_CONSERVATIVE (50%): micro-batch") and plan.micro_batch == 64


def kfit(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "KCONFIG_CONFIG": str(cwd / ".config"), **env}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "kfit.py"), *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def test_cli_check_hardware_shows_memory_warnings_and_advice(tmp_path, lenet):
    (tmp_path / ".config").write_text(lenet.text)
    hw = kfit(tmp_path, "check-hardware", GPU="t4", FREE_GB="8")
    assert hw.returncode == 0, hw.stderr
    assert "policy planner" in hw.stdout and "memory: predicted peak" in hw.stdout
    assert "warning: GPU 0 (Tesla T4)" in hw.stdout
    assert hw.stdout.count("Plan for ") == 1 and "Hyperparams:" not in hw.stdout  # the plan once
