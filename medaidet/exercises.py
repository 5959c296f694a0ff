"""Checking a learner's answer to a notebook exercise against the solution the run computed.

Each numeric exercise of the course ends with two cells: one where the learner writes an
answer (``my_answer_N = None`` until they do) and the worked solution, which computes the
answer on this run's data and calls :func:`check`. Numbers are compared with a relative
tolerance, text without regard to case and surrounding spaces; dicts, lists and tuples are
compared element by element, so the message can say which part is off.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["check", "compare", "Verdict"]


def compare(answer, solution, rtol: float = 1e-2, where: str = "") -> str | None:
    """None when ``answer`` matches ``solution``, else a sentence saying where it does not."""
    at = f" at {where}" if where else ""
    if isinstance(solution, dict):
        if not isinstance(answer, dict):
            return f"expected a dict with keys {sorted(solution)}{at}, got {type(answer).__name__}"
        if set(answer) != set(solution):
            return f"expected the keys {sorted(solution)}{at}, got {sorted(answer)}"
        for key in solution:
            problem = compare(answer[key], solution[key], rtol, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(solution, (list, tuple)):
        if not isinstance(answer, (list, tuple)) or len(answer) != len(solution):
            return f"expected {len(solution)} values{at}, got {answer!r}"
        for i, (a, s) in enumerate(zip(answer, solution)):
            problem = compare(a, s, rtol, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(solution, str):
        if not isinstance(answer, str) or answer.strip().lower() != solution.strip().lower():
            return f"{answer!r}{at} is not the answer"
        return None
    if isinstance(solution, numbers.Number) and not isinstance(solution, bool):
        if isinstance(answer, bool) or not isinstance(answer, numbers.Number):
            return f"expected a number{at}, got {answer!r}"
        if not math.isclose(float(answer), float(solution), rel_tol=rtol, abs_tol=1e-9):
            return f"{answer!r}{at} is not the answer (within {rtol:.0%})"
        return None
    return None if answer == solution else f"{answer!r}{at} is not the answer"


class Verdict:
    """What :func:`check` returns: true when the answer is right. A notebook shows nothing for
    it (``check`` has printed the verdict already; a bare ``True``/``False`` would repeat it)."""

    def __init__(self, right: bool):
        self.right = bool(right)

    def __bool__(self) -> bool:
        return self.right

    def __repr__(self) -> str:
        return f"Verdict(right={self.right})"

    def _ipython_display_(self) -> None:
        """IPython calls this instead of showing the repr: nothing more to show."""


def check(answer, solution, exercise: str, rtol: float = 1e-2) -> Verdict:
    """Print whether ``answer`` is right; the :class:`Verdict` is true if it is. ``None``: not
    answered yet."""
    if answer is None:
        print(f"{exercise}: no answer yet (set it in the cell above and run both again)")
        return Verdict(False)
    problem = compare(answer, solution, rtol)
    print(f"{exercise}: " + ("right" if problem is None else f"not yet: {problem}"))
    return Verdict(problem is None)
