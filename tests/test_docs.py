"""The user documentation: README.md is a short front door, every relative link in README.md and docs/
resolves (the file, and the heading when a link names one), and no user-visible text speaks of the
specification documents ("the seed", "seed 002") instead of describing what kfit does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 300

# The user guide: README.md and docs/**/*.md. docs/architecture.md is the maintainers' page and may name
# the specification documents.
GUIDE = [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "architecture.md"
                         or p.parent != ROOT / "docs")]
KCONFIG = [ROOT / "Kconfig", *sorted((ROOT / "kconfigs").glob("Kconfig.*"))]

# The specification's "seed" (the seed, the primary seed, seed 002, the seed's ...). A random seed
# (KCONFIG_SEED, CONFIG_SEED, "random seed", "seeds disjoint", "(seed 42)") is not matched.
SPEC_SEED = re.compile(r"\bseed (0\d\d|'s)\b|\bthe (primary )?seed\b|\bprimary seed\b|\bseed's\b", re.IGNORECASE)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file, or whose heading in a Markdown file, does not exist."""
    broken = []
    for number, line in prose(path.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no heading with that anchor in {resolved.name})")
    return broken


def spec_seed_mentions(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(path.read_text().splitlines(), 1) if SPEC_SEED.search(line)]


def test_the_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/<topic>.md"


def test_the_readme_keeps_the_two_commands():
    """CI runs the README's test command, `make test`; a fresh clone trains with `make train`; `make check`
    (every test, the slow tier too) is named beside it."""
    text = README.read_text()
    assert re.search(r"^make train\b", text, re.MULTILINE)
    assert re.search(r"^make test\b", text, re.MULTILINE)
    assert "exec make test\n" in (ROOT / ".ci" / "run").read_text()
    assert "`make check`" in text


def test_the_readme_links_the_docs_pages():
    linked = {t.partition("#")[0] for _, line in prose(README.read_text()) for t in LINK.findall(line)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README does not link"


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", GUIDE + KCONFIG, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_speaks_of_the_specification_seed(path):
    assert spec_seed_mentions(path) == [], "describe kfit's own behaviour instead"


def test_the_checks_can_fail(tmp_path):
    """The checks above find what they look for (so a passing run means something)."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nowhere) [d](https://example.com)\n"
                    "The primary seed's tier table, seed 002's range and the seed's policy.\n"
                    "```sh\n[e](also-missing.md)\n```\nKCONFIG_SEED=1, a random seed, seeds disjoint, (seed 42).\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [b.split(": ", 1)[1] for b in broken_links(page)] == ["missing.md (no such file)",
                                                                     "#nowhere (no heading with that anchor in page.md)"]
        assert [m.split(":")[1] for m in spec_seed_mentions(page)] == ["4"]
    finally:
        ROOT = saved
    assert slug("`make bench-throughput`: CPU threads and micro-batch") == "make-bench-throughput-cpu-threads-and-micro-batch"
    assert slug("When the figures disagree with kfit's constants") == "when-the-figures-disagree-with-kfits-constants"
