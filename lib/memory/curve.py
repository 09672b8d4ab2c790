"""A step's peak against the batch size, and the search for the largest batch that fits a budget.

The peak is convex and piecewise affine in the batch size (`affine_runs`), so a few traced points
prove a line and every batch on it is read off exactly, with no trace. `PeakCurve` is that curve
over any exact measure; predict.py's StepCurve is it over a traced step plus the device's terms.
"""

from __future__ import annotations

from typing import Callable, Mapping

Vector = tuple[int, ...]  # a traced point: its peak bytes first, then anything else exact (the breakdown)


def _collinear(a: tuple[int, Vector], b: tuple[int, Vector], c: tuple[int, Vector]) -> bool:
    """b lies exactly on the line through a and c, in every component (integers: no rounding)."""
    return all((vb - va) * (c[0] - a[0]) == (vc - va) * (b[0] - a[0]) for va, vb, vc in zip(a[1], b[1], c[1]))


def affine_runs(points: Mapping[int, Vector | int]) -> list[tuple[int, int]]:
    """The stretches (first, last batch) of consecutive points on one line, three points at least.

    A step's peak is the largest of its moments' live bytes, each a sum of
    tensors that are constant or proportional to the batch, so the peak is
    convex and piecewise affine in the batch size: three points on one line
    prove it affine between the outer two. Measured: the shipped models'
    traces are affine to the byte from a batch of 1-4 (GPT-2, the custom
    transformer) or 48-256 (ResNets; LeNet-5 on CUDA) on.
    """
    pts = sorted((b, v if isinstance(v, tuple) else (v,)) for b, v in points.items())
    runs: list[tuple[int, int]] = []
    for i in range(1, len(pts) - 1):
        if _collinear(pts[i - 1], pts[i], pts[i + 1]):
            if runs and runs[-1][1] == pts[i][0]:  # the previous triple shares two points: the same line
                runs[-1] = (runs[-1][0], pts[i + 1][0])
            else:
                runs.append((pts[i - 1][0], pts[i + 1][0]))
    return runs


class PeakCurve:
    """One step's peak against the batch size: the points traced so far, and the lines they prove.

    `measure(b)` traces a point: a vector of exact integers, peak bytes first
    (anything else exact after it); `at(b)` is what the budget is compared with
    (StepCurve adds the device terms). Inside an affine run of points
    (`affine_runs`: every component on one line) a point is interpolated
    exactly, with no trace, so once the traces around the budget prove the
    curve affine there, a budget that moves (RAM available on a CPU) is
    answered from the line.
    """

    def __init__(self, measure: Callable[[int], Vector], known: Mapping[int, Vector] | None = None) -> None:
        self._measure = measure
        self.points: dict[int, Vector] = dict(known or {})

    def _run(self, lo: int, hi: int) -> tuple[int, int] | None:
        return next(((a, b) for a, b in affine_runs(self.points) if a <= lo and hi <= b), None)

    def vector(self, batch: int) -> Vector:
        """The point at `batch`: traced, or read off a proven line (exact: whole bytes per sample)."""
        if batch in self.points:
            return self.points[batch]
        run = self._run(batch, batch)
        if run is None:
            self.points[batch] = tuple(self._measure(batch))
            return self.points[batch]
        a, b = run
        return tuple(x + (y - x) * (batch - a) // (b - a) for x, y in zip(self.points[a], self.points[b]))

    def at(self, batch: int) -> int:
        return self.vector(batch)[0]

    def largest_fitting(self, budget: int, limit: int, *, low_first: bool = False) -> int:
        """The largest b in 1..limit with at(b) <= budget (0 when none).

        Starts from the closest points already known on either side of the
        budget, aims where the line through them crosses it, and stops as soon
        as three points on that line prove it: a cold search on an affine
        stretch traces limit, 1 and one or two aims; a warm one, nothing.
        `low_first`: with nothing known, try 1 before limit, for a curve where 1 may well not fit (a deep
        model's step at a long context): when it does not, limit is never traced; when it does, the search
        goes on as it would have, with the same points, so the answer is the same either way.
        """
        if limit < 1:
            return 0
        if low_first and not self.points and limit > 1 and self.at(1) > budget:
            return 0
        known = {b: self.at(b) for b in self.points}
        hi = min((b for b, p in known.items() if b <= limit and p > budget), default=0)
        if not hi:
            if self.at(limit) <= budget:
                return limit
            hi = limit
        lo = max((b for b, p in known.items() if b < hi and p <= budget), default=0)
        if not lo:
            if self.at(1) > budget:
                return 0
            lo = 1
        slow = False
        while hi - lo > 1:
            p_lo, p_hi = self.at(lo), self.at(hi)  # p_lo <= budget < p_hi
            guess = lo + (budget - p_lo) * (hi - lo) // (p_hi - p_lo)
            if self._run(lo, hi):  # the line is the curve: read the answer off it (the device terms round)
                guess = max(lo, min(guess, hi - 1))
                while guess > lo and self.at(guess) > budget:
                    guess -= 1
                while guess + 1 < hi and self.at(guess + 1) <= budget:
                    guess += 1
                return guess
            width, guess = hi - lo, min(max(guess, lo + 1), hi - 1)
            lo, hi = (guess, hi) if self.at(guess) <= budget else (lo, guess)
            if hi - lo <= width // 2:
                slow = False
            elif slow:  # the line missed twice (a kink in the curve): halve the bracket as well
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self.at(mid) <= budget else (lo, mid)
                slow = False
            else:
                slow = True
        return lo


def largest_fitting(peak: Callable[[int], int], budget: int, limit: int) -> int:
    """The largest b in 1..limit with peak(b) <= budget (0 when none), for a convex peak that grows with b
    (PeakCurve.largest_fitting with nothing known yet)."""
    return PeakCurve(lambda b: (peak(b),)).largest_fitting(budget, limit)
