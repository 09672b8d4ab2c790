"""The Makefile's simple targets are lists, as the kernel's are: every target that only runs `kfit <target>` is in
KFIT_TARGETS, every one that only runs `scripts/<target>.py` in SCRIPT_TARGETS, each list has one rule, and
`make help` is generated from the same lists (every target's help-<target>)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAKEFILES = [ROOT / "Makefile", *sorted((ROOT / "scripts" / "make").glob("*.mk"))]


def make_value(tmp_path: Path, expression: str) -> str:
    """`expression` expanded by make after the Makefile and its fragments are read."""
    probe = tmp_path / "probe.mk"
    probe.write_text(f"kfit-probe:\n\t@:$(info {expression})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("MFLAGS", "KCONFIG_CONFIG")}
    result = subprocess.run(["make", "--no-print-directory", "-s", "-f", str(ROOT / "Makefile"), "-f", str(probe),
                             "kfit-probe"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def recipes() -> list[tuple[str, str, str]]:
    """(file, target line, recipe) of every rule with a one-line recipe in the Makefile and its fragments."""
    found = []
    for path in MAKEFILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            if re.match(r"^[^\t#\s][^=]*:", line) and lines[i + 1].startswith("\t") and (
                    i + 2 == len(lines) or not lines[i + 2].startswith("\t")):
                found.append((path.name, line, lines[i + 1].strip()))
    return found


def test_no_rule_repeats_the_list_rules():
    """A rule whose whole recipe runs kfit with its own name, or a script of its own name, belongs in a list."""
    alike = [f"{name}: {target}" for name, target, recipe in recipes()
             if re.fullmatch(r"\$\(Q\)\$\(KFIT\) [a-z][\w-]*", recipe)
             or re.fullmatch(r"\$\(Q\)\$\(RUN_PY\) .*scripts/\w+\.py\)?", recipe)]
    assert alike == []


def test_every_listed_target_is_a_command_or_script_and_has_its_help_line(tmp_path):
    from lib.cli import parser

    kfit_targets = make_value(tmp_path, "$(KFIT_TARGETS)").split()
    script_targets = make_value(tmp_path, "$(SCRIPT_TARGETS)").split()
    assert {"plan", "train", "randconfig", "hpo-apply"} <= set(kfit_targets)
    assert {"bench-memory", "bench-throughput", "validate-gpu"} <= set(script_targets)
    commands = set(next(a for a in parser()._actions if a.dest == "command").choices)
    assert set(kfit_targets) <= commands, set(kfit_targets) - commands
    missing = [t for t in script_targets if not (ROOT / "scripts" / f"{t.replace('-', '_')}.py").is_file()]
    assert missing == []
    helped = make_value(tmp_path, "$(HELP_TARGETS)").split()
    assert set(kfit_targets + script_targets) <= set(helped)
    assert len(helped) == len(set(helped))
    for target in helped:
        assert make_value(tmp_path, f"$(help-{target})"), f"{target} has no help-{target}"


def test_help_lists_every_target_of_the_lists_and_the_rules(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("MFLAGS", "KCONFIG_CONFIG")}
    out = subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "help"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60).stdout
    listed = [line.split()[0] for line in out.split("Defconfigs")[0].splitlines() if line.startswith("  ")]
    helped = make_value(tmp_path, "$(HELP_TARGETS)").split()
    assert listed[:len(helped)] == helped and {"<name>-defconfig", "<fragment>.config"} <= set(listed)
    # every target with a rule of its own is listed: nothing is left out of help when it moves into a list
    ruled = {m.group(1) for path in MAKEFILES for m in re.finditer(r"(?m)^([a-z][a-z-]*):(?!=)", path.read_text())}
    assert ruled - {"test", "check"} <= set(helped) | {"kfit-probe"}, ruled - set(helped)
