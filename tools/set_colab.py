"""Write what Colab needs from pyproject's repository URL: every notebook's setup cell,
the READMEs' tables of "Open in Colab" badges (README.md: the English notebooks; README.ja.md:
the Japanese edition's) and their quick start's `git clone` line.

    python tools/set_colab.py            # every notebook (notebooks/, notebooks/ja/), and the
                                         # READMEs (README.md, README.ja.md)
    python tools/set_colab.py A.ipynb …  # only these notebooks (and README.md)
    python tools/set_colab.py --check    # change nothing; exit 1 if something differs

The URL is ``[project.urls] Repository`` in pyproject.toml: set it there, then run this.
A notebook's cell tagged ``colab-setup`` is replaced (its id and metadata kept, outputs
cleared) and moved first; a notebook without one gets it. The cell installs the extras the
notebook's metadata names (``{"medaidet": {"extras": ["mpi"]}}``). Nothing else in a
notebook changes, and a file that already agrees is not rewritten.
"""
import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tools"))
from medaidet_tools import colab  # noqa: E402  (this checkout's, not an installed one)


def differs(path: Path, repo: str) -> bool:
    import nbformat

    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    cells = colab.setup_cells(nb)
    return not (nb.cells and cells == [nb.cells[0]] and nb.cells[0].cell_type == "code"
                and nb.cells[0].source == colab.notebook_setup_cell(nb, repo)
                and not nb.cells[0].get("outputs"))


def set_clone_line(readme: Path, repo: str, write: bool) -> bool:
    """The quick start's `git clone URL` line names the repository; True if it differed."""
    text = readme.read_text(encoding="utf-8")
    new = re.sub(r"(?m)^git clone \S+$", lambda _: f"git clone {repo}.git", text)
    if new != text and write:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to update (default: notebooks/*.ipynb and "
                             "notebooks/ja/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="only report the files that differ (exit 1)")
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml",
                        help="where the repository URL is read (default: %(default)s)")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="the README whose badge table is written (default: %(default)s)")
    args = parser.parse_args(argv)
    repo = colab.repository_url(args.pyproject)
    paths = args.notebooks or [*sorted((REPO / "notebooks").glob("*.ipynb")),
                               *sorted((REPO / "notebooks" / "ja").glob("*.ipynb"))]
    if not paths:
        parser.error("no notebooks found")
    stale = []
    for path in paths:
        if args.check:
            if differs(path, repo):
                stale.append(path)
                print(f"differs: {path}")
        elif colab.insert_setup_cell(path, repo):
            print(f"updated: {path}")
        else:
            print(f"unchanged: {path}")
    # each table lists a whole edition of the course
    readmes = [(args.readme, sorted((REPO / "notebooks").glob("*.ipynb")))]
    japanese = args.readme.with_name("README.ja.md")
    if japanese.is_file():
        readmes.append((japanese, sorted((REPO / "notebooks" / "ja").glob("*.ipynb"))))
    for readme, every in readmes:
        badges = colab.update_readme_badges(readme, repo, every, write=not args.check)
        if set_clone_line(readme, repo, write=not args.check) or badges:
            if args.check:
                stale.append(readme)
            print(f"{'differs' if args.check else 'updated'}: {readme}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
