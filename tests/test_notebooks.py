"""The committed notebooks are clean, valid and parameterisable by the course runner."""
import ast
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def _read(path):
    return nbformat.read(str(path), as_version=nbformat.NO_CONVERT)


def _assigned_names(source: str) -> set:
    tree = ast.parse(source)
    return {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)}


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"


def test_names_are_numbered_and_unique():
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), \
            f"{path.name}: name it NN_topic.ipynb (the runner runs them in name order)"
    prefixes = [path.name[:2] for path in NOTEBOOKS]
    assert len(prefixes) == len(set(prefixes)), f"two notebooks share a number: {prefixes}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_valid_nbformat4(path):
    nb = _read(path)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    kernelspec = nb.metadata.get("kernelspec")
    assert kernelspec is None or kernelspec.get("name") == "python3", kernelspec


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_one_parameters_cell_with_profile(path):
    nb = _read(path)
    tagged = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters', want 1"
    cell = tagged[0]
    assert cell.cell_type == "code"
    assert "profile" in _assigned_names(cell.source), \
        f"{path.name}: the parameters cell must assign `profile`"
    assert "injected-parameters" not in cell.metadata.get("tags", [])
