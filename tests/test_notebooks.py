"""The committed notebooks are clean, valid and parameterisable by the course runner."""
import ast
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
# with the Japanese edition's (tests/test_japanese_edition.py keeps the two editions paired)
EVERY = NOTEBOOKS + sorted((NOTEBOOKS_DIR / "ja").glob("*.ipynb"))
EVERY_IDS = [str(p.relative_to(NOTEBOOKS_DIR)) for p in EVERY]


def _read(path):
    return nbformat.read(str(path), as_version=nbformat.NO_CONVERT)


def _assigned_names(source: str) -> set:
    tree = ast.parse(source)
    return {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)}


def test_names_are_numbered_and_unique():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), \
            f"{path.name}: name it NN_topic.ipynb (the runner runs them in name order)"
    prefixes = [path.name[:2] for path in NOTEBOOKS]
    assert len(prefixes) == len(set(prefixes)), f"two notebooks share a number: {prefixes}"


@pytest.mark.parametrize("path", EVERY, ids=EVERY_IDS)
def test_valid_nbformat4(path):
    nb = _read(path)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    kernelspec = nb.metadata.get("kernelspec")
    assert kernelspec is None or kernelspec.get("name") == "python3", kernelspec


@pytest.mark.parametrize("path", EVERY, ids=EVERY_IDS)
def test_committed_without_outputs(path):
    nb = _read(path)
    assert "papermill" not in nb.metadata, f"{path.name} is an executed copy (papermill metadata)"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {index} has outputs: clear them"
        assert cell.execution_count is None, \
            f"{path.name} cell {index} has execution_count {cell.execution_count}: clear it"
        assert "papermill" not in cell.metadata and "execution" not in cell.metadata, \
            f"{path.name} cell {index} has execution metadata: clear it"


@pytest.mark.parametrize("path", EVERY, ids=EVERY_IDS)
def test_one_parameters_cell_with_profile(path):
    nb = _read(path)
    tagged = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters', want 1"
    cell = tagged[0]
    assert cell.cell_type == "code"
    assert "profile" in _assigned_names(cell.source), \
        f"{path.name}: the parameters cell must assign `profile`"
    assert "injected-parameters" not in cell.metadata.get("tags", [])


@pytest.mark.parametrize("path", EVERY, ids=EVERY_IDS)
def test_automation_cells_are_tagged_and_hidden(path):
    # asserts for CI and files for the runner stay out of the reading flow
    nb = _read(path)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        automation = (re.search(r"^\s*assert\b", cell.source, re.M)
                      or "MEDAIDET_COURSE_OUT" in cell.source)
        if automation and "colab-setup" not in tags:
            assert "ci-check" in tags, f"{path.name} cell {index}: tag it ci-check"
        if "ci-check" in tags:
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, \
                f"{path.name} cell {index}: a ci-check cell is hidden (jupyter.source_hidden)"


def test_no_internal_incident_labels_in_the_product():
    # "seed 003" means nothing to a learner
    root = NOTEBOOKS_DIR.parent
    files = [*EVERY, *root.glob("README*.md"), *root.glob("medaidet/**/*.py"),
             *root.glob("docs/**/*.md"), *root.glob("tools/*.py"),
             *(f for f in root.glob("tests/**/*.py") if f.name != "test_notebooks.py")]
    pattern = re.compile(r"\bseeds? 00\d|\bseed-00\d", re.I)
    hits = [f"{f.relative_to(root)}: {m.group(0)}" for f in files
            for m in pattern.finditer(f.read_text(encoding="utf-8"))]
    assert not hits, hits


def _heading(cell) -> str:
    return cell.source.splitlines()[0] if cell.cell_type == "markdown" and cell.source else ""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_prerequisites_recap_and_exercises_each_with_a_solution(path):
    """3 to 5 exercises; each "### Exercise N · …" solution is not empty; one asking
    ``my_answer_N = …`` is followed by a folded cell with ``check(… my_answer_N …)``."""
    cells = _read(path).cells
    text = "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")
    assert "**Prerequisites:**" in text, f"{path.name}: say what to run or know first"
    assert re.search(r"^## Recap", text, re.M), f"{path.name}: end with a recap"
    exercises = [i for i, c in enumerate(cells) if c.cell_type == "markdown"
                 and re.search(r"(?m)^## Exercises$", c.source)]
    assert len(exercises) == 1, f"{path.name}: one markdown cell with '## Exercises'"
    listed = re.split(r"(?m)^## Exercises$", cells[exercises[0]].source)[1]
    numbers = [int(n) for n in re.findall(r"(?m)^(\d+)\. ", listed)]
    assert numbers == list(range(1, len(numbers) + 1)) and 3 <= len(numbers) <= 5, \
        f"{path.name}: exercises {numbers}, want 3 to 5"
    starts = [i for i, c in enumerate(cells) if _heading(c) == "## Solutions"]
    assert len(starts) == 1 and starts[0] > exercises[0], \
        f"{path.name}: a '## Solutions' markdown cell after the exercises"
    parts = {}
    for i in range(starts[0] + 1, len(cells)):
        found = re.fullmatch(r"### Exercise (\d+) · .+", _heading(cells[i]))
        if found:
            parts[int(found[1])] = [i]
        elif parts and not _heading(cells[i]).startswith("## "):
            parts[max(parts)].append(i)
    assert sorted(parts) == numbers, f"{path.name}: solutions for {sorted(parts)}, " \
                                     f"exercises {numbers}"
    for n, part in parts.items():
        body = [cells[i] for i in part[1:]]
        assert body or "\n" in cells[part[0]].source.strip(), \
            f"{path.name}: exercise {n} has a heading and no solution"
        answers = [c for c in body if c.cell_type == "code"
                   and f"my_answer_{n}" in _assigned_names(c.source)]
        for answer in answers:
            assert not answer.metadata.get("jupyter", {}).get("source_hidden"), \
                f"{path.name}: the my_answer_{n} cell is for the learner: do not fold it"
            later = body[body.index(answer) + 1:]
            assert any(c.cell_type == "code" and re.search(rf"check\(.*\bmy_answer_{n}\b", c.source)
                       and c.metadata.get("jupyter", {}).get("source_hidden") for c in later), \
                f"{path.name}: exercise {n}: a folded solution cell calling check(my_answer_{n}, …)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_overrides_parameter_comes_last(path):
    """``f(iterations=100, **overrides)`` is a TypeError when overrides names iterations too:
    apply them after, ``config.replace(**overrides)`` or ``base.update(overrides)``."""
    nb = _read(path)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        python = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                           for line in cell.source.splitlines())     # IPython magics
        for node in ast.walk(ast.parse(python)):
            if not isinstance(node, ast.Call):
                continue
            spread = [k for k in node.keywords if k.arg is None
                      and isinstance(k.value, ast.Name) and k.value.id == "overrides"]
            if spread and (len(node.keywords) > 1 or node.args) and not (
                    isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                    and len(node.keywords) == 1 and not node.args):
                pytest.fail(f"{path.name} cell {index}, line {node.lineno}: **overrides spread "
                            f"beside other arguments; apply it last with .replace(**overrides)")
