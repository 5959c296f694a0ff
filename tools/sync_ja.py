"""Copy the English notebooks' code into the Japanese edition (notebooks/ja/).

    python tools/sync_ja.py            # every notebook pair
    python tools/sync_ja.py --check    # change nothing; exit 1 if a pair's code differs

The English edition is edited first. This copies, for each pair, every code cell (source and
metadata), each markdown cell's metadata and the notebook's metadata from English to
Japanese, and leaves the Japanese markdown text alone: the text that changed in English is
then translated by hand, and tests/test_japanese_edition.py says which cells no longer match.
A pair whose cells differ in number or kind (a cell added or removed in English) is reported
and not touched: add the cell to the Japanese notebook first.

A Japanese code cell may differ from its English one in its comments and in the text of its
string literals, where the Japanese holds Japanese (an exercise's label ``"演習 1"``, the
sentences a solution prints); such a cell is left as it is (:func:`same_code`). Any other
difference, a changed expression inside an f-string too, copies the English cell over it.
"""
import argparse
import ast
import copy
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JAPANESE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")


def _python(source: str) -> ast.AST | None:
    """The cell as Python (IPython's magics and shell lines turned into calls), or None."""
    from IPython.core.inputtransformer2 import TransformerManager
    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None


def _text(node) -> bool:
    """A string literal or f-string that holds Japanese."""
    return isinstance(node, (ast.Constant, ast.JoinedStr)) and any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and JAPANESE.search(n.value)
        for n in ast.walk(node))


def _filled_in(node) -> list:
    """The expressions an f-string fills in (none for a plain string), in a comparable form."""
    return sorted(ast.dump(v.value) for v in getattr(node, "values", ())
                  if isinstance(v, ast.FormattedValue))


def _same(en, ja) -> bool:
    if _text(ja) and isinstance(en, (ast.Constant, ast.JoinedStr)) and (
            isinstance(en, ast.JoinedStr) or isinstance(en.value, str)):
        return _filled_in(en) == _filled_in(ja)     # a sentence may put them in another order
    if type(en) is not type(ja):
        return False
    if not isinstance(en, ast.AST):      # None in a list (a dict's ** entry, no default)
        return en == ja
    for field in en._fields:
        a, b = getattr(en, field, None), getattr(ja, field, None)
        if isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b) or not all(map(_same, a, b)):
                return False
        elif isinstance(a, ast.AST):
            if not isinstance(b, ast.AST) or not _same(a, b):
                return False
        elif a != b:
            return False
    return True


def same_code(english: str, japanese: str) -> bool:
    """Whether two code cells run the same code: comments aside, and Japanese text in place
    of a string literal's English (the values an f-string fills in unchanged)."""
    en, ja = _python(english), _python(japanese)
    if en is None or ja is None:
        return english == japanese
    return _same(en, ja)


def sync(english: Path, japanese: Path, write: bool) -> str:
    """'unchanged', 'updated' (or 'differs' without ``write``), or why it cannot be synced."""
    import nbformat

    en = nbformat.read(str(english), as_version=nbformat.NO_CONVERT)
    ja = nbformat.read(str(japanese), as_version=nbformat.NO_CONVERT)
    if [c.cell_type for c in en.cells] != [c.cell_type for c in ja.cells]:
        return (f"cells differ in number or kind ({len(en.cells)} in English, {len(ja.cells)} "
                f"in Japanese): add or remove the cell in {japanese} first")
    before = nbformat.writes(ja)
    ja.metadata = copy.deepcopy(en.metadata)
    for source, target in zip(en.cells, ja.cells):
        target.metadata = copy.deepcopy(source.metadata)
        if source.cell_type == "code" and not same_code(source.source, target.source):
            target.source = source.source
    if nbformat.writes(ja) == before:
        return "unchanged"
    if write:
        nbformat.write(ja, str(japanese))
    return "updated" if write else "differs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report the pairs that differ (exit 1)")
    args = parser.parse_args(argv)
    status = 0
    for english in sorted((REPO / "notebooks").glob("*.ipynb")):
        japanese = REPO / "notebooks" / "ja" / english.name
        if not japanese.is_file():
            print(f"missing: {japanese} (translate {english.name})")
            status = 1
            continue
        result = sync(english, japanese, write=not args.check)
        print(f"{result}: {japanese.relative_to(REPO)}")
        if result not in ("unchanged", "updated"):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
