"""Copy the English notebooks' code into the Japanese edition (notebooks/ja/).

    python tools/sync_ja.py            # every notebook pair
    python tools/sync_ja.py --check    # change nothing; exit 1 if a pair's code differs

The English edition is edited first. This copies, for each pair, every code cell (source and
metadata), each markdown cell's metadata and the notebook's metadata from English to
Japanese, and leaves the Japanese markdown text alone: the text that changed in English is
then translated by hand, and tests/test_japanese_edition.py says which cells no longer match.
A pair whose cells differ in number or kind (a cell added or removed in English) is reported
and not touched: add the cell to the Japanese notebook first.
"""
import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
        if source.cell_type == "code":
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
