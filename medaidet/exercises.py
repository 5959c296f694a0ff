"""Checking a learner's answer to a notebook exercise against the solution the run computed:
numbers within a relative tolerance, text ignoring case and spaces around it, containers element
by element. The verdict speaks the label's language (``"exercise 1"`` or ``"演習 1"``); class
names and yes/no may be answered in either language (:data:`SYNONYMS`)."""
import math
import numbers
import re
from dataclasses import dataclass

__all__ = ["check", "compare", "Verdict"]

# Japanese answers accepted for the English words a solution holds (and the other way round).
SYNONYMS = {"赤血球": ("rbc",), "白血球": ("wbc",), "血小板": ("platelets",),
            "はい": ("yes",), "いいえ": ("no",),
            "あり": ("yes", "with"), "なし": ("no", "without")}


def _same_word(answer: str, solution: str) -> bool:
    """Whether two words are the same answer: equal but for case, or one the other's Japanese."""
    a, s = answer.strip().lower(), solution.strip().lower()
    return a == s or s in SYNONYMS.get(a, ()) or a in SYNONYMS.get(s, ())

MESSAGES = {
    "en": {"dict": "expected a dict with keys {keys}{at}, got {got}",
           "keys": "expected the keys {keys}{at}, got {got}",
           "values": "expected {n} values{at}, got {got}",
           "number": "expected a number{at}, got {got}",
           "wrong": "{got}{at} is not the answer",
           "tolerance": "{got}{at} is not the answer (within {rtol:.0%})",
           "at": " at {where}",
           "none": "{label}: no answer yet (set it in the cell above and run both again)",
           "right": "{label}: right", "not yet": "{label}: not yet: {problem}"},
    "ja": {"dict": "キー {keys} の dict のはずです{at}。答えは {got} です",
           "keys": "キーは {keys} のはずです{at}。答えのキーは {got} です",
           "values": "値が {n} 個のはずです{at}。答えは {got} です",
           "number": "数値のはずです{at}。答えは {got} です",
           "wrong": "{got}{at} は答えではありません",
           "tolerance": "{got}{at} は答えではありません (許す差は {rtol:.0%})",
           "at": " ({where} の位置)",
           "none": "{label}: まだ答えがありません (上のセルで答えを設定し、2 つのセルをもう一度実行してください)",
           "right": "{label}: 正解です", "not yet": "{label}: まだです。{problem}"},
}


def compare(answer, solution, rtol: float = 1e-2, where: str = "",
            lang: str = "en") -> str | None:
    """None when ``answer`` matches ``solution``, else where it does not (``lang``: en or ja)."""
    say = MESSAGES[lang]
    at = say["at"].format(where=where) if where else ""
    if isinstance(solution, dict):
        if not isinstance(answer, dict):
            return say["dict"].format(keys=sorted(solution), at=at, got=type(answer).__name__)
        if set(answer) != set(solution):
            return say["keys"].format(keys=sorted(solution), at=at, got=sorted(answer))
        return next(filter(None, (compare(answer[key], solution[key], rtol, f"{where}[{key!r}]",
                                          lang) for key in solution)), None)
    if isinstance(solution, (list, tuple)):
        if not isinstance(answer, (list, tuple)) or len(answer) != len(solution):
            return say["values"].format(n=len(solution), at=at, got=repr(answer))
        return next(filter(None, (compare(a, s, rtol, f"{where}[{i}]", lang)
                                  for i, (a, s) in enumerate(zip(answer, solution)))), None)
    if isinstance(solution, bool) and isinstance(answer, str):      # "はい" for True
        word = answer.strip().lower()
        answer = (True if _same_word(word, "yes") or word == "true" else
                  False if _same_word(word, "no") or word == "false" else answer)
    if isinstance(solution, numbers.Number) and not isinstance(solution, bool):
        if isinstance(answer, bool) or not isinstance(answer, numbers.Number):
            return say["number"].format(at=at, got=repr(answer))
        return (None if math.isclose(float(answer), float(solution), rel_tol=rtol, abs_tol=1e-9)
                else say["tolerance"].format(got=repr(answer), at=at, rtol=rtol))
    right = (isinstance(answer, str) and _same_word(answer, solution)
             if isinstance(solution, str) else answer == solution)
    return None if right else say["wrong"].format(got=repr(answer), at=at)


@dataclass(eq=False)
class Verdict:
    """What :func:`check` returns: true when right; shown as nothing (``check`` printed it)."""

    right: bool

    def __post_init__(self):
        self.right = bool(self.right)

    def __bool__(self) -> bool:
        return self.right

    def _ipython_display_(self) -> None:
        """IPython calls this instead of showing the repr: nothing more to show."""


def check(answer, solution, exercise: str, rtol: float = 1e-2) -> Verdict:
    """Print whether ``answer`` (None: not yet given) is right, in the language of ``exercise``."""
    lang = "ja" if re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", exercise) else "en"
    say = MESSAGES[lang]
    if answer is None:
        print(say["none"].format(label=exercise))
        return Verdict(False)
    problem = compare(answer, solution, rtol, lang=lang)
    print(say["right"].format(label=exercise) if problem is None
          else say["not yet"].format(label=exercise, problem=problem))
    return Verdict(problem is None)
