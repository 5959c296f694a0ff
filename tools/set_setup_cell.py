"""Write the Colab setup cell (medaidet.env.colab.SETUP_CELL) first into course notebooks.

    python tools/set_setup_cell.py            # every notebooks/*.ipynb
    python tools/set_setup_cell.py A.ipynb …  # only these
    python tools/set_setup_cell.py --check    # change nothing; exit 1 if a notebook differs

The cell tagged ``colab-setup`` is replaced (its id and metadata kept, outputs cleared)
and moved first; a notebook without one gets it. Nothing else in a notebook changes, and
a notebook that already has the cell is not rewritten.
"""
import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from medaidet.env import colab  # noqa: E402  (this checkout's, not an installed one)


def differs(path: Path) -> bool:
    import nbformat

    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    cells = colab.setup_cells(nb)
    return not (nb.cells and cells == [nb.cells[0]] and nb.cells[0].source == colab.SETUP_CELL
                and not nb.cells[0].get("outputs") and nb.cells[0].cell_type == "code")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to update (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="only report the notebooks whose setup cell differs (exit 1)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((REPO / "notebooks").glob("*.ipynb"))
    if not paths:
        parser.error("no notebooks found")
    stale = []
    for path in paths:
        if args.check:
            if differs(path):
                stale.append(path)
                print(f"differs: {path}")
        elif colab.insert_setup_cell(path):
            print(f"updated: {path}")
        else:
            print(f"unchanged: {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
