"""medaidet.exercises: a learner's answer against the run's solution."""
import pytest

from medaidet.exercises import check, compare

SOLUTION = {"train": (3, 1.25), "val": (1, 0.9)}


def test_a_right_answer_within_the_tolerance(capsys):
    assert check({"train": [3, 1.26], "val": (1, 0.9)}, SOLUTION, "exercise 1")
    assert capsys.readouterr().out == "exercise 1: right\n"


@pytest.mark.parametrize("answer, says", [
    ({"train": (3, 1.25)}, "expected the keys ['train', 'val'], got ['train']"),
    ({"train": (4, 1.25), "val": (1, 0.9)}, "4 at ['train'][0] is not the answer (within 1%)"),
    ({"train": (3,), "val": (1, 0.9)}, "expected 2 values at ['train'], got (3,)"),
    ({"train": ("3", 1.25), "val": (1, 0.9)}, "expected a number at ['train'][0], got '3'"),
    ([3, 1.25], "expected a dict with keys ['train', 'val'], got list"),
])
def test_a_wrong_answer_says_where(answer, says, capsys):
    assert not check(answer, SOLUTION, "exercise 1")
    assert capsys.readouterr().out == f"exercise 1: not yet: {says}\n"


def test_no_answer_yet_and_text_answers(capsys):
    assert not check(None, SOLUTION, "exercise 2")
    assert "no answer yet" in capsys.readouterr().out
    assert compare(" InvalidObjectError ", "invalidobjecterror") is None
    assert compare("KeyError", "InvalidObjectError") == "'KeyError' is not the answer"
    assert compare(True, 1) == "expected a number, got True"


def test_a_notebook_shows_nothing_for_the_verdict(capsys):
    """The solution cells end with check(...): IPython must not add "False" under the printout."""
    from IPython.core.interactiveshell import InteractiveShell

    formatter = InteractiveShell.instance().display_formatter
    for answer in (None, {"train": (3, 1.25), "val": (1, 0.9)}):
        verdict = check(answer, SOLUTION, "exercise 1")
        assert formatter.format(verdict) == ({}, {})
        assert formatter.format(bool(verdict)) != ({}, {})   # what a plain bool would show
    assert capsys.readouterr().out.count("exercise 1: ") == 2


def test_the_verdict_speaks_the_labels_language(capsys):
    """Japanese for exercises labelled 演習 N; Japanese answers work in either edition."""
    assert check({"train": [3, 1.26], "val": (1, 0.9)}, SOLUTION, "演習 1")
    assert not check({"train": (4, 1.25), "val": (1, 0.9)}, SOLUTION, "演習 1")
    assert not check(None, SOLUTION, "演習 2")
    assert capsys.readouterr().out.splitlines() == [
        "演習 1: 正解です",
        "演習 1: まだです。4 ([\'train\'][0] の位置) は答えではありません (許す差は 1%)",
        "演習 2: まだ答えがありません (上のセルで答えを設定し、2 つのセルをもう一度実行してください)"]
    for answer, solution in (("白血球", "wbc"), (" 血小板 ", "platelets"), ("はい", "yes"),
                             ("いいえ", "No"), ("赤血球", "RBC")):
        assert compare(answer, solution) is None, answer
    assert compare("白血球", "rbc") == "'白血球' is not the answer"
    for answer, solution in (("はい", True), ("いいえ", False), (" Yes ", True), (True, True)):
        assert compare(answer, solution) is None, answer
    assert compare("はい", False) is not None and compare("maybe", True) is not None
    assert compare("はい", "no", lang="ja") == "'はい' は答えではありません"


def test_ari_nashi_answer_yes_no_and_with_without():
    """あり / なし answer yes / no and with / without; a Japanese solution takes English too."""
    for answer, solution in (("あり", "yes"), (" なし ", "no"), ("あり", True), ("なし", False),
                             ("あり", "with"), ("なし", "without"), ("with", "あり"),
                             ("Without", "なし"), ("yes", "はい"), ("あり", "あり")):
        assert compare(answer, solution) is None, (answer, solution)
    for answer, solution in (("あり", "no"), ("なし", True), ("あり", "without"),
                             ("yes", "with"), ("with", "なし"), ("はい", "あり")):
        assert compare(answer, solution) is not None, (answer, solution)
    assert check(["あり", "なし"], ["yes", "no"], "演習 3")
