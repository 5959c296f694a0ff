"""The course as a static website, from the notebooks a `make run` executed (`make site`).

    python tools/build_site.py [--outputs outputs] [--out site]

Sphinx with myst-nb (the Executable Books project's notebook reader for Sphinx) and the
sphinx-book-theme: each executed notebook becomes a page with its figures and outputs as the
run left them (nothing is executed here, and nothing is fetched: the build needs no network).
The English edition is built from OUTPUTS/*.ipynb into OUT/, the Japanese from
OUTPUTS/ja/*.ipynb into OUT/ja/ (an edition that was not run shows its notebooks without
outputs, and says so); every page links to its twin in the other edition. The index says
what the course is, for whom, how long the run took (papermill's durations in the notebooks)
and shows one of its figures. Each notebook page has a download of the notebook and, when a
real repository URL is configured (``--repository``, else pyproject's ``[project.urls]
Repository``; one with ``<...>`` in it is a placeholder), its Colab link; without one, no
Colab or repository link is shown. The notebooks' Markdown outputs (the course's tables) are
read as GitHub-flavoured Markdown, so their pipe tables become tables; every figure links to
its full-size image; the solutions are folded; the runner's plumbing (the Colab setup cell,
the checks tagged ci-check, papermill's injected parameters) is left out; search is Sphinx's
own. The README (the setup) and docs/ are pages too; a link to a file of the repository that
is no page goes to the repository (is plain text without one). Sphinx builds in a temporary
folder (myst-nb writes its jupyter_execute/ beside the build) and the pages are copied to OUT.

A notebook is untrusted input here too: the site publishes only the course. Raw HTML in its
Markdown shows as text (inline formatting such as <sub> aside), an image or link to a local
file is dropped (its text kept), an HTML output with a script is left out; each is said on
stderr. OUT is the builder's own folder (a ``.medaidet-site`` marker, the course runner's
rule): a folder holding anything else, or inside the outputs or notebooks, is refused.

Why Sphinx + myst-nb rather than Jupyter Book: Jupyter Book 1 is a command line over these
same two packages, and Jupyter Book 2 (mystmd) builds with Node; this way the site is three
pip packages (the `site` extra) in the environment the course already has, builds offline,
and Sphinx's own search splits Japanese words without a service.
"""
from __future__ import annotations

import argparse
import base64
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
#: The only HTML a notebook's Markdown may carry onto a page: inline formatting, no
#: attributes. Any other tag (a script, an image, a frame, a link) shows as text.
INLINE_TAGS = {"sub", "sup", "br", "b", "i", "em", "strong", "code", "kbd"}
ACTIVE_TAGS = {"script", "style", "iframe", "img", "a", "object", "embed", "form", "svg",
               "link", "meta", "video", "audio", "base"}
SITE_MARKER = ".medaidet-site"       # the builder's own --out folder (prepare_output_dir)


class SiteError(Exception):
    """What is missing to build the site, and how to get it."""


def repository_url(given: str | None = None) -> str | None:
    """``given``, else pyproject's Repository; None when that is a placeholder or missing."""
    from medaidet_tools.colab import repository_slug
    from medaidet_tools.colab import repository_url as configured
    try:
        url = given or configured(REPO / "pyproject.toml")
        repository_slug(url)
    except ValueError:
        return None
    return None if "<" in url or ">" in url else url.removesuffix(".git").rstrip("/")


NOT_RUN = {
    "en": "This page shows the notebook without its outputs: the English edition was not run "
          "for this build of the site (`make run`, then `make site`).",
    "ja": "このページは出力のないノートブックです。このサイトを作ったときに日本語版を実行していないためです "
          "(`make run COURSE_LANG=ja` のあとに `make site`)。",
}


def warn(message: str) -> None:
    print(f"make site: {message}", file=sys.stderr)


def safe_markdown(text: str, where: str) -> str:
    """``text`` with what a page must not take from a notebook made harmless: HTML tags
    other than :data:`INLINE_TAGS` escaped (shown as text), images of local files dropped
    and links to local files turned into their text (a page publishes only the course, not
    a file the notebook points at). Code spans and fenced blocks are left as they are."""
    def prose(part):
        def tag(m):
            if m.group(0) == "<!--":
                return "&lt;!--"
            name = m.group(1).lstrip("/").lower()
            if name in INLINE_TAGS and not m.group(2).strip():
                return m.group(0)
            if m.group(2).strip() or name in ACTIVE_TAGS:   # not a placeholder like <split>
                warn(f"{where}: HTML {m.group(0)[:40]} shown as text, not rendered")
            return "&lt;" + m.group(0)[1:]

        def link(m):
            bang, label, target = m.groups()
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#") \
                    or (not bang and re.fullmatch(r"[\w.-]+\.(ipynb|md)(#.*)?", target)):
                return m.group(0)
            warn(f"{where}: {'image' if bang else 'link'} {target} points at a local file: "
                 f"{'dropped' if bang else 'its text kept'}")
            return "" if bang else label
        part = re.sub(r"<!--|<(/?[A-Za-z][\w-]*)([^>]*)>", tag, part)
        return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", link, part)
    pieces = re.split(r"(```.*?```|`[^`\n]*`)", text, flags=re.S)
    return "".join(p if i % 2 else prose(p) for i, p in enumerate(pieces))


UNSAFE_HTML = re.compile(r"<\s*(script|iframe|object|embed)\b|\bon[a-z]+\s*=|javascript:", re.I)


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
        where = f"{source.name}, cell {cell.get('id', len(cells))}"
        if cell.cell_type == "markdown":
            cell.source = safe_markdown(cell.source, where)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/markdown" in data:
                data["text/markdown"] = safe_markdown(data["text/markdown"], where)
            if UNSAFE_HTML.search(data.get("text/html", "")):
                warn(f"{where}: an HTML output with a script left out (its text shown)")
                del data["text/html"]
        cells.append(cell)
    nb.cells = cells
    nbformat.write(nb, str(target))


def link_to_repository(markdown: str, here: Path, repo_dir: str, repo: str | None) -> str:
    """Relative links and images that are not in the staged site (``here``: the page's
    folder there) point into the repository (``repo_dir``: the page's folder in it); with
    no repository (``None``), they become their text."""
    def fix(match):
        bang, text, target = match.group(1), match.group(2), match.group(3)
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", target) or target.startswith("#") or (here / path).exists():
            return match.group(0)
        if repo is None:
            return text
        where = "raw" if bang else "blob"
        full = posixpath.normpath(f"{repo_dir}/{path}")
        return f"{bang}[{text}]({repo}/{where}/main/{full}{'#' + anchor if anchor else ''})"
    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", fix, markdown)


CONF = '''
import posixpath

project = {title!r}
author = "medaidet contributors"
language = {lang!r}
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_title = {title!r}
nb_execution_mode = "off"
nb_render_markdown_format = "gfm"   # Markdown outputs (medaidet.tables.Table): pipe tables
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
exclude_patterns = ["_build"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["edition.css"]
html_context = {{"twin_root": {twin!r}, "twin_label": {twin_label!r}, "twin_pages": {twin_pages!r}}}
html_theme_options = {{
    "use_download_button": True,
    "article_header_end": ["edition-switch.html", "article-header-buttons.html"],
    **{repository!r},
}}


def link_images(app, doctree, docname):
    """Every image opens full size: a link to its file around it (Sphinx puts one only
    around an image given a size)."""
    from docutils import nodes
    from sphinx.util.osutil import relative_uri
    images = relative_uri(app.builder.get_target_uri(docname), "_images")
    for image in list(doctree.findall(nodes.image)):
        if isinstance(image.parent, nodes.reference):
            continue
        uri = image.get("candidates", {{}}).get("*", image["uri"])
        known = app.env.images.get(uri)
        link = nodes.reference("", "", refuri=posixpath.join(images, known[1]) if known else uri)
        image.replace_self(link)
        link.append(image)


def setup(app):
    app.connect("doctree-resolved", link_images)
'''

CSS = """.header-article-items__end { display: flex; align-items: center; gap: .25rem; }
.edition-switch { font-weight: 600; border: 1px solid var(--pst-color-border); }
"""

SWITCH = '''{%- set root = pathto(root_doc)[:-10] -%}
{%- set page = pagename if pagename in twin_pages else "index" -%}
<a class="btn btn-sm edition-switch" href="{{ root }}{{ twin_root }}{{ page }}.html" hreflang="{{ 'ja' if twin_root == 'ja/' else 'en' }}">{{ twin_label }}</a>
'''


INTRO = {
    "en": ("A course in Jupyter notebooks on detecting and counting blood cells (red cells, "
           "white cells and platelets) in the BCCD microscope images with ChainerCV's SSD: the "
           "data and its annotation errors, the model and its loss, training, evaluation, "
           "counting, reproducibility, troubleshooting, scaling, using the detector, and whose "
           "labels to trust.\n\n**For** students and practitioners of medical AI who read "
           "Python and want to see a detector trained, measured and used from end to end.\n\n"
           "**How long:** {timing}\n\n{figure}"
           "Read it here page by page, or run it yourself ([setup](setup.md)). "
           '<a href="ja/index.html" hreflang="ja">日本語版 (the Japanese edition)</a>.\n'),
    "ja": ("ChainerCV の SSD で、BCCD の顕微鏡画像から血液細胞 (赤血球・白血球・血小板) を"
           "検出し数える Jupyter ノートブックの講座です。データとそのアノテーションの誤り、"
           "モデルと損失、学習、評価、計数、再現性、トラブルシューティング、スケーリング、"
           "検出器の利用、誰のラベルを信じるかを扱います。\n\n**対象:** Python が読め、"
           "検出器を学習・評価・利用するまでを通して見たい医療 AI の学生と実務者。\n\n"
           "**所要時間:** {timing}\n\n{figure}"
           "このサイトでページごとに読むことも、自分で実行することもできます "
           "([セットアップ](setup.md))。"
           '<a href="../index.html" hreflang="en">English edition (英語版)</a>。\n'),
}
TIMING = {
    "en": ("this site shows a run of the `{profile}` profile: its {n} notebook(s) ran in "
           "{total} on the machine that built it{train}. (`cpu`, the default without a GPU, "
           "trains a small SSD on the CPU; `full` trains SSD300 on a GPU; `smoke` only checks "
           "the mechanics.)"),
    "ja": ("このサイトは `{profile}` プロファイルの実行結果です。{n} 本のノートブックの実行に、"
           "サイトを作ったマシンで {total}{train} かかりました。"
           "(`cpu` は GPU のないときの既定で小さな SSD を CPU で学習し、`full` は SSD300 を "
           "GPU で学習し、`smoke` は仕組みだけを確かめます。)"),
}
TRAINING = {"en": ", training (notebook 03) {} of it", "ja": " (うち学習 (ノートブック 03) が {})"}
NO_TIMING = {     # notebooks without papermill's durations: an edition that was not run
    "en": "not measured for this build (its notebooks were not run); a run's time depends on "
          "its profile and the machine (see setup).",
    "ja": "このビルドでは計測していません (ノートブックを実行していないため)。実行時間は"
          "プロファイルとマシンによります (セットアップを参照)。",
}
# The index's figure: the first image output of the first cell, in this order, that calls this.
FIGURES = [("04_evaluation", "plot_detections("), ("01_data", "plt.subplots(")]
CAPTION = {"en": "A figure of this run, from notebook {n}.", "ja": "この実行の図 (ノートブック {n})。"}


def minutes(seconds: float) -> str:
    return f"{round(seconds / 60)} min" if seconds >= 90 else f"{round(seconds)} s"


def run_timing(lang: str, notebooks: list) -> str:
    """How long the run took, from papermill's durations in the executed notebooks."""
    runs = [nbformat.read(str(n), as_version=4).metadata.get("papermill", {}) for n in notebooks]
    if not runs or any(r.get("duration") is None for r in runs):
        return NO_TIMING[lang]
    train = [r["duration"] for n, r in zip(notebooks, runs) if n.stem.startswith("03")]
    return TIMING[lang].format(profile=runs[0].get("parameters", {}).get("profile", "?"),
                               n=len(runs), total=minutes(sum(r["duration"] for r in runs)),
                               train=TRAINING[lang].format(minutes(train[0])) if train else "")


def index_figure(lang: str, notebooks: list, src: Path) -> str:
    """The Markdown of the index's figure (written into ``src``), or "" when there is none."""
    found = {n.stem: n for n in notebooks}
    for stem, call in FIGURES:
        if stem not in found:
            continue
        for cell in nbformat.read(str(found[stem]), as_version=4).cells:
            png = [o.data["image/png"] for o in cell.get("outputs", [])
                   if call in cell.source and "image/png" in o.get("data", {})]
            if png:
                (src / "course-figure.png").write_bytes(base64.b64decode(png[0]))
                caption = CAPTION[lang].format(n=stem[:2])
                return (f"![{caption}](course-figure.png)\n\n"
                        f"*{caption}* ([]({stem}.ipynb))\n\n")   # []: the page's title
    return ""


def notebook_table(lang: str, names: list, repo: str | None) -> str:
    """README's table of notebooks, for the site: each one's page, and its Colab badge only
    when there is a real repository."""
    from medaidet_tools.colab import COLAB_BADGE_IMAGE, COLAB_URL, repository_slug
    rows = ["| notebook | |" + (" |" if repo else ""), "|---|---|" + ("---|" if repo else "")]
    for name in names:
        colab = ""
        if repo:
            url = COLAB_URL.format(slug=repository_slug(repo), branch="main",
                                   name=("ja/" if lang == "ja" else "") + name + ".ipynb")
            colab = f" [![Open In Colab]({COLAB_BADGE_IMAGE})]({url}) |"
        read = "読む" if lang == "ja" else "read"
        rows.append(f"| {name.replace('_', ' ')} | [{read}]({name}.ipynb) |{colab}")
    return "\n".join(rows)


def edition_notebooks(lang: str, outputs: Path):
    """The notebooks of an edition's pages, and the note they carry (None: they ran)."""
    notebooks = sorted((outputs / EDITIONS[lang][0]).glob("*.ipynb"))
    if notebooks:
        return notebooks, None
    # this edition was not run: its notebooks as written
    return sorted((REPO / "notebooks" / EDITIONS[lang][0]).glob("*.ipynb")), NOT_RUN[lang]


def stage_edition(lang: str, outputs: Path, src: Path, repo: str | None) -> None:
    _, readme, docs, solutions, title = EDITIONS[lang]
    notebooks, note = edition_notebooks(lang, outputs)
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
    from medaidet_tools.colab import BADGES_BEGIN, BADGES_END
    text = (REPO / readme).read_text(encoding="utf-8")
    before, _, rest = text.partition(BADGES_BEGIN)
    if rest:                    # the badge table: the site's pages (and Colab, if real)
        text = before + notebook_table(lang, names, repo) + rest.partition(BADGES_END)[2]
    for name in names:          # the README's links to the notebooks: their pages
        text = text.replace(f"](notebooks/{'ja/' if lang == 'ja' else ''}{name}.ipynb",
                            f"]({name}.ipynb")
    # ...and to the other README: the other edition's setup page
    text = re.sub(r"\[([^\]]*)\]\(README(\.ja)?\.md\)",
                  lambda m: f'<a href="{"ja/" if m.group(2) else "../"}setup.html">{m.group(1)}</a>',
                  text)
    (src / "setup.md").write_text(link_to_repository(text, src, ".", repo), encoding="utf-8")
    toc = "\n".join(names)
    intro = INTRO[lang].format(timing=run_timing(lang, notebooks),
                               figure=index_figure(lang, notebooks, src))
    index = (f"# {title}\n\n{intro}\n```{{toctree}}\n:maxdepth: 1\n:caption: "
             f"{'ノートブック' if lang == 'ja' else 'Notebooks'}\n\n{toc}\n```\n\n"
             f"```{{toctree}}\n:maxdepth: 1\n:caption: {'資料' if lang == 'ja' else 'Setup and notes'}"
             f"\n\nsetup\n" + "\n".join(d[:-3] for d in docs) + "\n```\n")
    (src / "index.md").write_text(index, encoding="utf-8")
    twin, twin_label = ("ja/", "日本語") if lang == "en" else ("../", "English")
    other = edition_notebooks("ja" if lang == "en" else "en", outputs)[0]
    twin_pages = sorted({"index", "setup"}   # the pages of both editions
                        | ({n.stem for n in notebooks} & {n.stem for n in other}))
    repository = {} if repo is None else {   # the Colab and repository links: a real one only
        "repository_url": repo, "repository_branch": "main",
        "path_to_docs": "notebooks" if lang == "en" else "notebooks/ja",
        "launch_buttons": {"colab_url": "https://colab.research.google.com"}}
    (src / "conf.py").write_text(CONF.format(
        title=title, lang=lang, twin=twin, twin_label=twin_label, repository=repository,
        twin_pages=twin_pages), encoding="utf-8")
    (src / "_templates" / "edition-switch.html").write_text(SWITCH, encoding="utf-8")
    (src / "_static").mkdir()
    (src / "_static" / "edition.css").write_text(CSS, encoding="utf-8")


def build(outputs: Path, out: Path, repository: str | None = None) -> None:
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
    from medaidet.arguments import prepare_output_dir
    from medaidet.errors import ConfigError
    try:   # the builder's own folder (a marker): never a user's folder, nor inside the inputs
        out = prepare_output_dir(out, "--out", inputs=(outputs, REPO / "notebooks", REPO / "docs"),
                                 marker=SITE_MARKER)
    except ConfigError as exc:
        raise SiteError(str(exc)) from None
    repo = repository_url(repository)
    if repo is None:
        print("make site: no repository URL configured (pyproject's [project.urls] Repository "
              "is a placeholder; or --repository URL): the pages have no Colab or repository "
              "links", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for lang in EDITIONS:
            src, build_dir = Path(tmp) / lang, Path(tmp) / f"build-{lang}"
            stage_edition(lang, outputs, src, repo)
            # myst-nb writes jupyter_execute/ beside the HTML folder: both stay in tmp
            done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W",
                                   "--keep-going", "-d", str(build_dir / "doctrees"), str(src),
                                   str(build_dir / "html")], capture_output=True, text=True)
            if done.returncode:
                raise SiteError(f"sphinx failed for the {lang} edition:\n{done.stderr[-3000:]}")
            if done.stderr.strip():
                print(done.stderr.strip(), file=sys.stderr)
        for lang in EDITIONS:
            shutil.copytree(Path(tmp) / f"build-{lang}" / "html",
                            out if lang == "en" else out / "ja", dirs_exist_ok=True)
    (out / ".nojekyll").write_text("")      # GitHub Pages: serve _static/ as it is
    print(f"site: {out}/index.html (English), {out}/ja/index.html (日本語)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs",
                        help="where make run left the executed notebooks (ja/ inside)")
    parser.add_argument("--out", type=Path, default=REPO / "site")
    parser.add_argument("--repository", help="the repository's URL for the Colab links "
                        "(default: pyproject's [project.urls] Repository, if not a placeholder)")
    args = parser.parse_args(argv)
    try:
        build(args.outputs, args.out, args.repository)
    except SiteError as exc:
        print(f"make site: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
