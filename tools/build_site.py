"""The course as a static website, from the notebooks a `make run` executed (`make site`).

    python tools/build_site.py [--outputs outputs] [--out site]

Sphinx with myst-nb (the Executable Books project's notebook reader for Sphinx) and the
sphinx-book-theme: each executed notebook becomes a page with its figures and outputs as the
run left them (nothing is executed here, and nothing is fetched: the build needs no network).
The English edition is built from OUTPUTS/*.ipynb into OUT/, the Japanese from
OUTPUTS/ja/*.ipynb into OUT/ja/ (an edition that was not run shows its notebooks without
outputs, and says so); every page links to its twin in the other edition. Each
notebook page has its Colab link (the repository URL of pyproject.toml) and a download of the
notebook; the solutions are folded; the runner's plumbing (the Colab setup cell, the checks
tagged ci-check, papermill's injected parameters) is left out; search is Sphinx's own. The
README (the setup) and docs/ are pages too; a link to a file of the repository that is no
page goes to the repository.

Why Sphinx + myst-nb rather than Jupyter Book: Jupyter Book 1 is a command line over these
same two packages, and Jupyter Book 2 (mystmd) builds with Node; this way the site is three
pip packages (the `site` extra) in the environment the course already has, builds offline,
and Sphinx's own search splits Japanese words without a service.
"""
from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EDITIONS = {   # language: (outputs subfolder, README, docs, Solutions heading, title)
    "en": ("", "README.md", ["docs/cpu-detector.md", "docs/gpu.md"], "## Solutions",
           "Detecting blood cells with ChainerCV's SSD"),
    "ja": ("ja", "README.ja.md", ["docs/ja/glossary.md"], "## 解答",
           "ChainerCV の SSD で血液細胞を検出する"),
}
LEFT_OUT = {"colab-setup", "ci-check", "injected-parameters"}


class SiteError(Exception):
    """What is missing to build the site, and how to get it."""


def repository_url() -> str:
    from medaidet.env.colab import repository_url as url
    return url(REPO / "pyproject.toml")


NOT_RUN = {
    "en": "This page shows the notebook without its outputs: the English edition was not run "
          "for this build of the site (`make run`, then `make site`).",
    "ja": "このページは出力のないノートブックです。このサイトを作ったときに日本語版を実行していないためです "
          "(`make run COURSE_LANG=ja` のあとに `make site`)。",
}


def stage_notebook(source: Path, target: Path, solutions: str, note: str | None = None) -> None:
    """The executed notebook, its plumbing removed and its solutions folded; ``note``: a
    paragraph put first (an edition that was not run)."""
    nb = nbformat.read(str(source), as_version=4)
    if note:
        first = next(c for c in nb.cells if c.cell_type == "markdown")    # its title first
        heading, _, rest = first.source.partition("\n")
        first.source = f"{heading}\n\n```{{note}}\n{note}\n```\n{rest}"
    cells, in_solutions = [], False
    for cell in nb.cells:
        tags = set(cell.metadata.get("tags", []))
        if tags & LEFT_OUT:
            continue
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            in_solutions = cell.source.startswith(solutions)
        if in_solutions and cell.cell_type == "code":
            cell.metadata["tags"] = sorted(tags | {"hide-cell"})
        cells.append(cell)
    nb.cells = cells
    nbformat.write(nb, str(target))


def link_to_repository(markdown: str, here: Path, repo_dir: str, repo: str) -> str:
    """Relative links and images that are not in the staged site (``here``: the page's
    folder there) point into the repository (``repo_dir``: the page's folder in it)."""
    def fix(match):
        bang, text, target = match.group(1), match.group(2), match.group(3)
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", target) or target.startswith("#") or (here / path).exists():
            return match.group(0)
        where = "raw" if bang else "blob"
        full = posixpath.normpath(f"{repo_dir}/{path}")
        return f"{bang}[{text}]({repo}/{where}/main/{full}{'#' + anchor if anchor else ''})"
    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", fix, markdown)


CONF = '''
project = {title!r}
language = {lang!r}
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_title = {title!r}
nb_execution_mode = "off"
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
exclude_patterns = ["_build"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["edition.css"]
html_context = {{"twin_root": {twin!r}, "twin_label": {twin_label!r}, "twin_pages": {twin_pages!r}}}
html_theme_options = {{
    "repository_url": {repo!r},
    "path_to_docs": {notebooks!r},
    "repository_branch": "main",
    "use_download_button": True,
    "launch_buttons": {{"colab_url": "https://colab.research.google.com"}},
    "article_header_end": ["edition-switch.html", "article-header-buttons.html"],
}}
'''

CSS = """.header-article-items__end { display: flex; align-items: center; gap: .25rem; }
.edition-switch { font-weight: 600; border: 1px solid var(--pst-color-border); }
"""

SWITCH = '''{%- set root = pathto(root_doc)[:-10] -%}
{%- set page = pagename if pagename in twin_pages else "index" -%}
<a class="btn btn-sm edition-switch" href="{{ root }}{{ twin_root }}{{ page }}.html" hreflang="{{ 'ja' if twin_root == 'ja/' else 'en' }}">{{ twin_label }}</a>
'''


def stage_edition(lang: str, outputs: Path, src: Path, repo: str) -> None:
    sub, readme, docs, solutions, title = EDITIONS[lang]
    notebooks, note = sorted((outputs / sub).glob("*.ipynb")), None
    if not notebooks:            # this edition was not run: its notebooks as written
        notebooks, note = sorted((REPO / "notebooks" / sub).glob("*.ipynb")), NOT_RUN[lang]
    (src / "_templates").mkdir(parents=True)
    names = []
    for notebook in notebooks:
        stage_notebook(notebook, src / notebook.name, solutions, note)
        names.append(notebook.stem)
    for doc in docs:
        (src / doc).parent.mkdir(parents=True, exist_ok=True)
        figures = REPO / Path(doc).parent / "figures"
        if figures.is_dir() and not (src / Path(doc).parent / "figures").exists():
            shutil.copytree(figures, src / Path(doc).parent / "figures")
    for doc in docs:
        text = (REPO / doc).read_text(encoding="utf-8")
        (src / doc).write_text(link_to_repository(text, (src / doc).parent,
                                                  Path(doc).parent.as_posix(), repo),
                               encoding="utf-8")
    text = (REPO / readme).read_text(encoding="utf-8")
    for name in names:          # the README's links to the notebooks: their pages
        text = text.replace(f"](notebooks/{'ja/' if lang == 'ja' else ''}{name}.ipynb",
                            f"]({name}.ipynb")
    # ...and to the other README: the other edition's setup page
    text = re.sub(r"\[([^\]]*)\]\(README(\.ja)?\.md\)",
                  lambda m: f'<a href="{"ja/" if m.group(2) else "../"}setup.html">{m.group(1)}</a>',
                  text)
    (src / "setup.md").write_text(link_to_repository(text, src, ".", repo), encoding="utf-8")
    toc = "\n".join(names)
    index = (f"# {title}\n\n```{{toctree}}\n:maxdepth: 1\n:caption: "
             f"{'ノートブック' if lang == 'ja' else 'Notebooks'}\n\n{toc}\n```\n\n"
             f"```{{toctree}}\n:maxdepth: 1\n:caption: {'資料' if lang == 'ja' else 'Setup and notes'}"
             f"\n\nsetup\n" + "\n".join(d[:-3] for d in docs) + "\n```\n")
    (src / "index.md").write_text(index, encoding="utf-8")
    twin, twin_label = ("ja/", "日本語") if lang == "en" else ("../", "English")
    twin_pages = sorted({"index", "setup"} | {n.stem for n in notebooks})   # in both editions
    (src / "conf.py").write_text(CONF.format(
        title=title, lang=lang, twin=twin, twin_label=twin_label, repo=repo,
        twin_pages=twin_pages,
        notebooks="notebooks" if lang == "en" else "notebooks/ja"), encoding="utf-8")
    (src / "_templates" / "edition-switch.html").write_text(SWITCH, encoding="utf-8")
    (src / "_static").mkdir()
    (src / "_static" / "edition.css").write_text(CSS, encoding="utf-8")


def build(outputs: Path, out: Path) -> None:
    run = [lang for lang, (sub, *_) in EDITIONS.items() if list((outputs / sub).glob("*.ipynb"))]
    if not run:
        raise SiteError(f"no executed notebooks to build the site from in {outputs} (nor in "
                        f"{outputs / 'ja'}). Run the course first: make run (and make run "
                        "COURSE_LANG=ja for the Japanese edition's outputs), then make site.")
    for lang in EDITIONS:
        if lang not in run:
            print(f"make site: the {lang} edition was not run ({outputs / EDITIONS[lang][0]} "
                  "holds no notebook): its pages show the notebooks without outputs",
                  file=sys.stderr)
    repo = repository_url()
    with tempfile.TemporaryDirectory() as tmp:
        for lang in EDITIONS:
            src = Path(tmp) / lang
            stage_edition(lang, outputs, src, repo)
            target = out if lang == "en" else out / "ja"
            done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W",
                                   "--keep-going",
                                   "-d", str(Path(tmp) / f"doctrees-{lang}"), str(src),
                                   str(target)], capture_output=True, text=True)
            if done.returncode:
                raise SiteError(f"sphinx failed for the {lang} edition:\n{done.stderr[-3000:]}")
            if done.stderr.strip():
                print(done.stderr.strip(), file=sys.stderr)
    (out / ".nojekyll").write_text("")      # GitHub Pages: serve _static/ as it is
    print(f"site: {out}/index.html (English), {out}/ja/index.html (日本語)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs",
                        help="where make run left the executed notebooks (ja/ inside)")
    parser.add_argument("--out", type=Path, default=REPO / "site")
    args = parser.parse_args(argv)
    try:
        build(args.outputs, args.out)
    except SiteError as exc:
        print(f"make site: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
