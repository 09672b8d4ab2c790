"""Every line that shows a micro-batch and accumulation shows numbers that multiply: '21 x 24 + 8 x 1 = 512', or
'batch=21 (last 8), grad_acc=25' (21 x 24 + 8). One formatter makes them all (lib.units.batch_split); these tests
render each line for many (effective, micro-batch, processes) and check that what it says adds up."""

import ast
import dataclasses
import operator
import re
from pathlib import Path

import pytest

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.units import batch_split

ROOT = Path(__file__).resolve().parent.parent
CPU = resolve_hardware(gpu="cpu")
MODEL = ModelDescription(name="lenet5")

# (effective, micro-batch, processes): exact splits, short last micro-batches, a last one of one sample (joined to
# the one before, as the trainer cuts it), a micro-batch above the share, uneven shares over processes
CASES = [(512, 64, 1), (512, 21, 1), (512, 21, 2), (512, 512, 1), (505, 21, 1), (22, 21, 1), (513, 21, 2),
         (1000, 7, 4), (96, 64, 1), (3, 21, 4), (1, 1, 1), (4096, 33, 8), (130, 64, 2)]
CASES += [(e, m, w) for e in (17, 100, 255, 256, 640) for m in (1, 2, 3, 5, 16, 31, 64, 300) for w in (1, 2, 3)]


def evaluate(expression: str) -> int:
    """'(21 x 12 + 4 x 1) x 2 processes' -> 512: the arithmetic a line states, and nothing else."""
    text = re.sub(r"\bprocess(es)?\b", "", expression).replace(" x ", " * ")
    ops = {ast.Add: operator.add, ast.Mult: operator.mul}

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"not a sum of products: {expression!r}")
    return walk(ast.parse(text, mode="eval"))


def multiplies(text: str) -> int:
    """The total of an 'A x B + C x D = E' text, checked to equal the E it states."""
    left, _, right = text.rpartition(" = ")
    assert evaluate(left) == int(right), text
    return int(right)


def compact_total(micro: str, count: int) -> int:
    """'21 (last 8)' with grad_acc 25 -> 21 x 24 + 8."""
    found = re.fullmatch(r"(\d+)(?: \(last (\d+)\))?", micro)
    halves = re.fullmatch(r"(\d+) \(last 2: (\d+) \+ (\d+)\)", micro)  # 21 x 23 + 11 + 11
    assert found or halves, micro
    if halves:
        return int(halves.group(1)) * (count - 2) + int(halves.group(2)) + int(halves.group(3))
    first, last = int(found.group(1)), int(found.group(2) or found.group(1))
    return first * (count - 1) + last


@pytest.fixture(scope="module")
def plan():
    return resolve(kc.defconfig_config("lenet5"), CPU, MODEL)


def at(plan, effective, micro, processes):
    return dataclasses.replace(plan, micro_batch=micro, grad_accum=-(-effective // processes // micro) or 1,
                               effective_batch=effective, world_size=processes)


@pytest.mark.parametrize("effective, micro, processes", CASES)
def test_the_formatter_multiplies_to_the_effective_batch(effective, micro, processes):
    split = batch_split(effective, micro, processes)
    assert multiplies(split.text()) == effective
    largest = -(-effective // processes)
    assert sum(split.sizes) == largest and split.count == len(split.sizes)
    assert compact_total(split.compact(), split.count) == largest
    assert split.last_micro_batch == split.sizes[-1] and max(split.sizes) <= max(micro, largest)


def test_the_sizes_are_the_trainers():
    """The formatter cuts a process's share exactly as the trainer does (lib.trainer.windows)."""
    from lib.trainer.windows import rank_batches

    for effective, micro, processes in CASES:
        window = list(range(effective))
        for rank in range(processes):
            sizes = [len(b) for b, weight in rank_batches(window, rank, processes, micro) if weight]
            share = len(window[rank * effective // processes:(rank + 1) * effective // processes])
            expected = list(batch_split(share, micro).sizes) if share else []  # no sample: a zero-weight pass
            assert sizes == expected, (effective, micro, processes, rank)


def test_examples():
    assert batch_split(512, 21).text() == "21 x 24 + 8 x 1 = 512"
    assert batch_split(512, 21).compact() == "21 (last 8)"
    assert batch_split(512, 64, 2).text() == "64 x 4 x 2 processes = 512"
    assert batch_split(512, 21, 2).text() == "(21 x 12 + 4 x 1) x 2 processes = 512"
    assert batch_split(505, 21).text() == "21 x 23 + 11 x 2 = 505"  # a lone last sample: the last two halve


@pytest.mark.parametrize("effective, micro, processes", CASES)
def test_the_plan_lines_multiply(plan, effective, micro, processes):
    """The start line, the plan table and the plan's JSON."""
    from lib.planning.render import format_plan, summary_line

    p = at(plan, effective, micro, processes)
    line = summary_line(p, CPU, MODEL)
    batch, accum, total = re.search(r"batch=(\d+(?: \(last [^)]*\))?), grad_acc=(\d+) \(effective=(\d+)", line).groups()
    shares = batch_split(effective, micro, processes).shares()
    assert compact_total(batch, int(accum)) == max(shares) and int(total) == effective
    if processes > 1:
        assert f"x {processes} processes" in line
    table = format_plan(p, kc.defconfig_config("lenet5"), CPU, MODEL)
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^  (micro-batch|grad accumulation|effective batch) +(.*)$",
                                                         table, re.M)}
    micro_shown = re.match(r"\d+(?: \([^)]*\))?", rows["micro-batch"]).group(0)  # its reason follows
    accum_shown = rows["grad accumulation"].split()[0]
    assert compact_total(micro_shown, int(accum_shown)) == max(shares)
    assert multiplies(rows["effective batch"].split("each step ", 1)[1]) == effective
    saved = p.to_dict()
    assert (saved["micro_batch"], saved["last_micro_batch"]) == (micro, batch_split(effective, micro, processes).sizes[-1])


@pytest.mark.parametrize("effective, micro, processes", CASES[:20])
def test_the_other_lines_multiply(plan, effective, micro, processes):
    """Step-time candidates, HPO trial and status lines, the plan matrix."""
    from lib.hpo.runner import _split_text
    from lib.report import MatrixRow, format_matrix
    from lib.steptime.choose import Candidate

    share = -(-effective // processes)
    split = batch_split(share, micro)
    candidate = Candidate(micro, split.count, False, 1.0, 1000.0, True, share)
    assert multiplies(candidate.describe().split(" -> ")[0]) == share
    attrs = {"micro_batch": micro, "effective_batch": effective, "world_size": processes}
    assert multiplies(_split_text(attrs)) == effective
    matrix = format_matrix([MatrixRow("lenet5", "cpu", at(plan, effective, micro, processes))]).splitlines()[1]
    micro_cell, accum_cell, effective_cell = re.search(r"cpu +(\d+(?: \(last [^)]*\))?) +(\d+) +(\d+)", matrix).groups()
    assert compact_total(micro_cell, int(accum_cell)) == share and int(effective_cell) == effective


def test_no_line_formats_a_micro_batch_and_accumulation_by_hand():
    """Only lib/units.py puts a micro-batch beside its accumulation; everything else calls batch_split."""
    pattern = re.compile(r"micro_batch\s*\}\s*(x|&times;|\*)\s*\{[^}]*grad_acc|micro_batch\}, grad_acc=|"
                         r"grad_accum\s*\}\s*(x|&times;)")
    offenders = []
    for path in [*ROOT.glob("lib/**/*.py"), *ROOT.glob("lib/templates/*.j2")]:
        if path.name != "units.py":
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                          if pattern.search(line)]
    assert not offenders, offenders
