"""The package is what the notebooks wrote (d2l's ``#@save``): a ``# @save medaidet/<module>.py``
cell's definitions are that module's code, docstrings aside, in both editions."""
import ast
import difflib
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^# @save (medaidet/[\w/]+\.py)[ \t]*$")
SECTION = re.compile(r"^## (\d+)\b", re.M)     # "## 7. The loss", "## 1 · Counts"
EDITIONS = {"en": ROOT / "notebooks", "ja": ROOT / "notebooks" / "ja"}


def _without_docstrings(node):
    node = ast.parse(ast.unparse(node))          # a copy
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant) \
                and isinstance(n.body[0].value.value, str):
            n.body = n.body[1:] or [ast.Pass()]
    return node


def _definitions(tree) -> dict:
    return {n.name: n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def differences(cell_source: str, module_source: str) -> dict:
    """Name -> what differs, for each of the cell's definitions the module does not hold."""
    module = _definitions(ast.parse(module_source))
    found = {}
    for name, written in _definitions(ast.parse(cell_source)).items():
        if name not in module:
            found[name] = "not in the module"
            continue
        a = ast.unparse(_without_docstrings(written)).splitlines()
        b = ast.unparse(_without_docstrings(module[name])).splitlines()
        if a != b:
            found[name] = "\n".join(difflib.unified_diff(b, a, "package", "notebook",
                                                         lineterm=""))
    return found


def saved_cells(folder: Path):
    """(notebook, section number, module path, source) of each ``# @save`` cell."""
    for path in sorted(folder.glob("*.ipynb")):
        section = None
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type == "markdown":
                headings = SECTION.findall(cell.source)
                section = int(headings[-1]) if headings else section
                continue
            first = cell.source.split("\n", 1)[0]
            match = MARK.match(first) if cell.cell_type == "code" else None
            if match:
                yield path.name, section, match.group(1), cell.source


CELLS = [(lang, *cell) for lang, folder in EDITIONS.items() for cell in saved_cells(folder)]


@pytest.mark.parametrize("lang, notebook, section, module, source", CELLS,
                         ids=[f"{c[0]}-{c[1][:2]}-{c[3]}" for c in CELLS])
def test_what_a_notebook_saves_is_the_packages_code(lang, notebook, section, module, source):
    path = ROOT / module
    assert path.is_file(), f"{lang}/{notebook} saves into {module}, which does not exist"
    module_source = path.read_text(encoding="utf-8")
    found = differences(source, module_source)
    assert not found, f"{lang}/{notebook} writes code the package does not hold as written:\n" \
        + "\n".join(f"{name}: {what}" for name, what in found.items())
    package = _definitions(ast.parse(module_source))
    for name in _definitions(ast.parse(source)):
        doc = " ".join((ast.get_docstring(package[name]) or "").split())
        where = f"notebook {notebook[:2]}, section {section}"
        assert where in doc.lower(), f"{module}'s {name} must say where it is written: {where!r}"


def test_both_editions_save_the_same_code_in_the_same_places():
    def saved(folder):
        return sorted((notebook, section, module, tuple(_definitions(ast.parse(source))))
                      for notebook, section, module, source in saved_cells(folder))
    en = saved(EDITIONS["en"])
    assert en, "no notebook saves code (a cell beginning with '# @save medaidet/...py')"
    assert saved(EDITIONS["ja"]) == en
