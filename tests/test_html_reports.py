"""The HTML reports in a real browser: headless Chromium at a wide (1400 px) and a narrow (700 px) window.

Each page is loaded once per width with a probe script appended (a copy; the report itself stays
script-free) that measures what a user saw go wrong: the page scrolling sideways, a chart wider than
its column, the focus machine's column out of view in the matrix, chart labels overlapping each other
or a marker. The screenshot of each load is kept in the test's tmp_path.

Chromium comes from scripts/ensure-chromium.sh (make test runs it; these tests run it too when no
browser is found); where it cannot be had, the tests skip and say why.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lib import lr_finder
from lib.hyperparams import TierPolicy
from lib.report import machines, plan_matrix, render_report

from tests.helpers import fake_plan, least_squares, minibatches

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTHS = (1400, 700)
FOCUS = "cpu"  # this machine: the last column before the focus came first

# Runs at the end of <body>, after layout; getBoundingClientRect forces it. The answer goes into a
# hidden element that --dump-dom prints.
PROBE = """
<pre id="kfit-probe" hidden></pre>
<script>
(() => {
  const doc = document.documentElement, box = e => e.getBoundingClientRect();
  const meets = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5
                          && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const out = {clientWidth: doc.clientWidth, scrollWidth: doc.scrollWidth, charts: [], collisions: []};
  for (const svg of document.querySelectorAll("svg")) {
    out.charts.push({right: box(svg).right, width: box(svg).width, column: box(svg.parentElement).width});
    const labels = [...svg.querySelectorAll("text")], marks = [...svg.querySelectorAll("circle, polygon")];
    labels.forEach((label, i) => {
      for (const other of [...labels.slice(i + 1), ...marks])
        if (meets(box(label), box(other)))
          out.collisions.push(label.textContent + " / " + (other.textContent || other.tagName));
    });
  }
  // The focus column must be in full view, right of the sticky names, with the matrix scrolled either way
  // (left at its far end, so the screenshot shows the column holding its place).
  const scroller = document.querySelector(".scroll"), focus = document.querySelector("th.focus");
  if (focus) {
    out.focusInView = [0, scroller.scrollWidth].map(left => {
      scroller.scrollLeft = left;
      const f = box(focus), s = box(scroller), n = box(document.querySelector("th.name"));
      return f.left >= Math.max(s.left, n.right) - 1 && f.right <= s.right + 1;
    });
    out.matrixScrolls = scroller.scrollWidth > scroller.clientWidth;
  }
  document.getElementById("kfit-probe").textContent = JSON.stringify(out);
})();
</script>
"""


def _find_browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


@pytest.fixture(scope="module")
def browser() -> str:
    path = _find_browser()
    if path is None:  # make test has run this already; a bare pytest run gets the same chance
        done = subprocess.run([str(ROOT / "scripts" / "ensure-chromium.sh")], capture_output=True, text=True,
                              timeout=600)
        path = _find_browser()
        if path is None:
            pytest.skip(f"no headless Chromium ({', '.join(BROWSERS)} not on PATH) and it could not be installed: "
                        f"{(done.stdout + done.stderr).strip() or 'scripts/ensure-chromium.sh said nothing'}")
    return path


def load(browser: str, page: Path, width: int, tmp_path: Path) -> dict:
    """Open a probed copy of `page` in a `width` px window: the probe's answer; the screenshot goes to
    tmp_path/<page>-<width>.png."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    shot = tmp_path / f"{page.stem}-{width}.png"
    # One launch does both: --screenshot and --dump-dom. Scrollbars stay, as in a user's browser, so the
    # probe compares against clientWidth (the window less its scrollbar).
    result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1600",
                             f"--screenshot={shot}", "--dump-dom", probed.as_uri()],
                            capture_output=True, text=True, timeout=120)
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)  # megabytes of browser state nobody reads
    found = re.search(r'<pre id="kfit-probe"[^>]*>(.*?)</pre>', result.stdout, re.S)
    assert found and found[1], f"the probe did not run (exit {result.returncode}): {result.stderr[-2000:]}"
    assert shot.stat().st_size > 1000, "the screenshot is empty"
    return json.loads(html.unescape(found[1]))


def check_layout(probe: dict, width: int) -> None:
    assert probe["scrollWidth"] <= probe["clientWidth"], f"the page scrolls sideways at {width} px: {probe}"
    for chart in probe["charts"]:
        assert chart["right"] <= probe["clientWidth"] + 0.5 and chart["width"] <= chart["column"] + 0.5, chart
    assert probe["collisions"] == [], f"labels overlap at {width} px: {probe['collisions']}"


@pytest.fixture(scope="module")
def plan_page(tmp_path_factory) -> Path:
    """Every machine's column (the tier policy: instant) and planner plans on the focus machine, for the
    charts (the planner's trace cache is warm after the first run of the suite)."""
    targets = machines()
    names = ["lenet5", "gpt2-tiny"]
    rows = plan_matrix(names, [t for t in targets if t[0] != FOCUS], TierPolicy())
    rows += plan_matrix(names, [t for t in targets if t[0] == FOCUS])
    return render_report(rows, FOCUS, tmp_path_factory.mktemp("plan") / "plan-report.html")


@pytest.fixture(scope="module")
def lr_page(tmp_path_factory) -> Path:
    """Two short sweeps on least squares (as tests/test_lr_finder.py), about a second."""
    X, y = least_squares(4.0, 10.0, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        results.append(lr_finder.range_test(torch.nn.Linear(16, 1, bias=False),
                                            lambda m: torch.optim.SGD(m.parameters(), lr=1.0),
                                            minibatches(X, y, 32, seed), F.mse_loss, min_lr=1e-5, max_lr=10.0,
                                            steps=60))
    torch.set_num_threads(threads)
    facts = [("config", "/a/long/path/without/spaces/" * 6 + ".config"), ("model", "linear")]
    out = tmp_path_factory.mktemp("lr") / "lr-report.html"
    out.write_text(lr_finder.render_report(results, lr_finder.summarize(results), title="LR range test: least squares",
                                           facts=facts))
    return out


def test_charts_scale_with_the_window_and_sizes_are_binary(plan_page, lr_page):
    for page in (plan_page.read_text(), lr_page.read_text()):
        svgs = re.findall(r"<svg\b[^>]*>", page)
        assert svgs and all("viewBox=" in s and not re.search(r'\swidth="\d', s) for s in svgs), svgs
    plan = plan_page.read_text()
    assert "1 GiB = 2<sup>30</sup> bytes" in plan and ("GiB" in plan or "MiB" in plan)
    assert not re.search(r"\d(\.\d+)?\s?[GM]B\b", plan), re.search(r".{40}\d(\.\d+)?\s?[GM]B\b.{20}", plan)


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_report_in_chromium(browser, plan_page, width, tmp_path):
    probe = load(browser, plan_page, width, tmp_path)
    check_layout(probe, width)
    assert probe["focusInView"] == [True, True], f"the {FOCUS} column leaves the view at {width} px"
    if width < 1000:
        assert probe["matrixScrolls"]  # 17 machines do not fit in 700 px: the matrix scrolls, not the page
    assert len(probe["charts"]) == 4  # per card: the breakdown bars and the peak curve


@pytest.mark.parametrize("width", WIDTHS)
def test_lr_report_in_chromium(browser, lr_page, width, tmp_path):
    probe = load(browser, lr_page, width, tmp_path)
    check_layout(probe, width)
    assert len(probe["charts"]) == 1


def test_probe_sees_what_the_user_saw(browser, tmp_path):
    """The checks bite: a chart of fixed width overflows at 700 px; a label on a marker collides."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><svg width="760" height="100" viewBox="0 0 760 100">'
                    '<circle cx="50" cy="20" r="6"/><text x="40" y="24">suggestion 0.1</text></svg></body></html>')
    probe = load(browser, page, 700, tmp_path)
    assert probe["scrollWidth"] > probe["clientWidth"] and probe["collisions"] == ["suggestion 0.1 / circle"]


@pytest.fixture(scope="module")
def recommend_page(tmp_path_factory) -> Path:
    """make recommend's page for three made-up plans on an 80 GiB GPU (no planning: the layout is the test)."""
    import dataclasses

    from lib import config as kconfig
    from lib.recommend import MODES, Recommendation, render_page, warnings_for

    base = kconfig.defconfig_config("gpt2")
    recs = []
    for mode, preset, params, peak in zip(MODES, ("51m", "124m", "774m"), (25.9e6, 86e6, 710e6), (21, 47, 74.4)):
        plan = dataclasses.replace(fake_plan()(base), device_type="cuda", precision="bf16", strategy="fsdp_grad_op",
                                   predicted_peak_bytes=int(peak * 2**30), budget_bytes=int(78 * mode.share * 2**30))
        config = kconfig.derive(base, {f"GPT2_PRESET_{preset.upper()}": True, "GPT2_BLOCK_SIZE": mode.context})
        rec = Recommendation(mode, config, plan, {}, parameters=int(params), tokens=int(params) * 25, steps=16929,
                             seconds=193719.0, energy_kwh=37.7, watts=700.0,
                             reasons=["710.0M parameters x 25 tokens each = 17,750,720,000 tokens = 16,929 steps"],
                             out_of_reach="no model in the seed's 23M-70M range trains 12 tokens per parameter within "
                                          "2 h in 50% of this machine's memory; the largest that does: 1.0M (tiny)")
        rec.warnings = warnings_for(rec, on_battery=True, dataset_tokens=449_536)
        recs.append(rec)
    out = tmp_path_factory.mktemp("recommend") / "recommend.html"
    out.write_text(render_page(recs, score_value=8.3, definition="reachable training FLOP/s (5.94e+14, 1 process(es)) "
                               "on a log scale", machine="NVIDIA H100 80GB HBM3", processes=1, free_bytes=78 * 2**30))
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_recommend_page_in_chromium(browser, recommend_page, width, tmp_path):
    page = recommend_page.read_text()
    assert "Performance score 8.3/10" in page and "74.40 GiB" in page
    assert not re.search(r"\d(\.\d+ ?| )[GM]B\b", page)  # sizes in GiB/MiB ("80GB" is the GPU's name)
    probe = load(browser, recommend_page, width, tmp_path)
    check_layout(probe, width)
    assert len(probe["charts"]) == 3  # one memory bar per mode


@pytest.fixture(scope="module")
def run_page(tmp_path_factory) -> Path:
    """make report's page of a real LeNet-5 run of 30 steps (evaluations every 10, the step timer's window),
    with a line cut short by a kill appended to its metrics.jsonl."""
    from lib import config as kc
    from lib.run_report import write_report
    from lib.threads import using_threads
    from tests.helpers import run

    tmp = tmp_path_factory.mktemp("run")
    fragment = tmp / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_MAX_STEPS=30\n'
                        "CONFIG_LOG_INTERVAL=3\nCONFIG_EVAL_INTERVAL=10\n")
    with using_threads(1):
        _, result = run(kc.make_defconfig("lenet5", [str(fragment)], out=tmp / "config"))
    with open(result.run_dir / "metrics.jsonl", "a") as metrics:
        metrics.write('{"step": 31, "loss": 0.')
    return write_report(result.run_dir)


def test_a_runs_page_has_every_curve_against_the_plans_predictions(run_page):
    page = run_page.read_text()
    titles = re.findall(r"<h2>([^<]+)</h2>", page)
    assert titles == ["Loss", "Evaluation metrics", "Learning rate", "Throughput (samples/s)", "Step time (ms)",
                      "Memory (MiB)", "Events"], titles
    for legend in ("training loss", "evaluation loss", "accuracy", "predicted by the plan", "a step&#39;s predicted "
                   "peak", "the step timer&#39;s window", "the process&#39;s resident memory"):
        assert legend in page, legend
    assert "1 line(s) of metrics.jsonl were not JSON objects" in page and "<td>finished</td>" in page
    assert "<script" not in page.lower()  # self-contained and static


@pytest.mark.parametrize("width", WIDTHS)
def test_run_report_in_chromium(browser, run_page, width, tmp_path):
    probe = load(browser, run_page, width, tmp_path)
    check_layout(probe, width)
    assert len(probe["charts"]) == 6
