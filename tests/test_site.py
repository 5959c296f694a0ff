"""tools/build_site.py (`make site`): the course's website from executed notebooks (the real
build from a smoke run is checked by tools/check_site.py in .ci/run)."""
import base64
import shutil
import sys

import nbformat
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import build_site  # noqa: E402  (tools/ is no package)
import check_site  # noqa: E402


def test_plumbing_goes_and_solutions_fold(tmp_path):
    source = REPO / "notebooks" / "03_training.ipynb"
    build_site.stage_notebook(source, tmp_path / "03.ipynb", "## Solutions")
    before = nbformat.read(str(source), as_version=4).cells
    after = nbformat.read(str(tmp_path / "03.ipynb"), as_version=4).cells
    left_out = [c for c in before if build_site.LEFT_OUT & set(c.metadata.get("tags", []))]
    assert left_out and len(after) == len(before) - len(left_out)
    heading = next(i for i, c in enumerate(after) if c.source.startswith("## Solutions"))
    folded = [i for i, c in enumerate(after) if "hide-cell" in c.metadata.get("tags", [])]
    code_after = [i for i, c in enumerate(after) if i > heading and c.cell_type == "code"]
    assert folded == code_after and folded


def test_links_outside_the_site_go_to_the_repository(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_bytes(b"png")
    text = ("[loss](../medaidet/ssd/loss.py#L3) ![fig](figures/a.png) ![gone](figures/b.png) "
            "[web](https://example.org/x) [here](#anchor)")
    out = build_site.link_to_repository(text, tmp_path, "docs", "https://github.com/o/r")
    assert "[loss](https://github.com/o/r/blob/main/medaidet/ssd/loss.py#L3)" in out
    assert "![fig](figures/a.png)" in out                      # in the site: kept
    assert "![gone](https://github.com/o/r/raw/main/docs/figures/b.png)" in out
    assert "[web](https://example.org/x)" in out and "[here](#anchor)" in out
    bare = build_site.link_to_repository(text, tmp_path, "docs", None)    # no repository
    assert bare.startswith("loss ![fig](figures/a.png) gone [web]")


def test_a_placeholder_repository_is_no_repository():
    assert build_site.repository_url("https://github.com/<your-github-user>/medaidet") is None
    assert build_site.repository_url("not a url") is None
    assert build_site.repository_url("https://github.com/o/r.git") == "https://github.com/o/r"
    configured = build_site.repository_url()           # pyproject's
    assert configured is None or "<" not in configured


def test_nothing_to_build_says_to_run_the_course(tmp_path, capsys):
    assert build_site.main(["--outputs", str(tmp_path), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert "make run" in err and "COURSE_LANG=ja" in err and str(tmp_path) in err
    assert not (tmp_path / "site").exists()


def test_an_edition_not_run_shows_its_notebooks_and_says_so(tmp_path):
    build_site.stage_notebook(REPO / "notebooks" / "ja" / "03_training.ipynb",
                              tmp_path / "03.ipynb", "## 解答", build_site.NOT_RUN["ja"])
    first = nbformat.read(str(tmp_path / "03.ipynb"), as_version=4).cells[0].source
    assert first.startswith("# 03") and build_site.NOT_RUN["ja"] in first.split("\n", 3)[3]


@pytest.mark.slow(seconds=8)
def test_both_editions_build_with_twins_colab_and_downloads(tmp_path):
    pytest.importorskip("sphinx")
    outputs = tmp_path / "outputs"        # the English edition "run"; the Japanese not
    outputs.mkdir()
    for notebook in (REPO / "notebooks").glob("0[34]_*.ipynb"):
        (outputs / notebook.name).write_bytes(notebook.read_bytes())
    site = tmp_path / "out" / "site"
    root_before = set(REPO.iterdir())
    assert build_site.main(["--outputs", str(outputs), "--out", str(site),
                            "--repository", "https://github.com/o/r"]) == 0
    assert [p.name for p in site.parent.iterdir()] == ["site"]      # nothing beside it
    assert not list(site.rglob("jupyter_execute"))
    assert not {p.name for p in set(REPO.iterdir()) - root_before} & {"jupyter_execute", "site"}
    for page, twin, colab in (("03_training.html", 'href="ja/03_training.html"',
                               "/blob/main/notebooks/03_training.ipynb"),
                              ("ja/03_training.html", 'href="../03_training.html"',
                               "/blob/main/notebooks/ja/03_training.ipynb")):
        html = (site / page).read_text(encoding="utf-8")
        assert twin in html and colab in html and "_sources/03_training.ipynb" in html
        assert "tag_hide-cell" in html and "colab-setup" not in html
    assert 'lang="ja"' in (site / "ja" / "index.html").read_text(encoding="utf-8")
    assert "日本語版を実行していない" in (site / "ja" / "03_training.html").read_text(encoding="utf-8")
    assert len(list((site / "ja").glob("[01]*.html"))) == len(list(
        (REPO / "notebooks" / "ja").glob("*.ipynb")))
    assert (site / "setup.html").is_file() and (site / "docs" / "cpu-detector.html").is_file()
    assert (site / "ja" / "docs" / "ja" / "glossary.html").is_file()


SIX_PANELS = """import matplotlib.pyplot as plt
from IPython.display import display
from medaidet.tables import Table
display(Table(["class", "boxes"], [["rbc", 1391], ["wbc", 127], ["platelets", 109]]))
fig, axes = plt.subplots(2, 3, figsize=(12, 6))
for i, ax in enumerate(axes.flat):
    ax.set_title(f"panel {i}")
plt.show()
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """A papermill-executed notebook: a package table, a six-panel figure, its durations."""
    papermill = pytest.importorskip("papermill")
    folder = tmp_path_factory.mktemp("outputs")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01 · A run"),
                                         nbformat.v4.new_code_cell(SIX_PANELS)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(folder / "source.ipynb"))
    papermill.execute_notebook(str(folder / "source.ipynb"), str(folder / "01_data.ipynb"),
                               parameters={"profile": "smoke"}, kernel_name="python3",
                               progress_bar=False)
    (folder / "source.ipynb").unlink()
    return folder


def problems_of(site, kind, tmp_path, only=None):
    return [p for p in check_site.check(site, tmp_path / "shots", only) if p.kind == kind]


@pytest.mark.slow(seconds=11)
def test_check_site_fails_on_raw_tables_unlinked_figures_and_placeholders(executed, tmp_path,
                                                                          monkeypatch):
    """A table read as CommonMark is left as a paragraph of pipes, which check_site fails."""
    pytest.importorskip("sphinx")
    pytest.importorskip("playwright")
    if shutil.which("chromium") is None:
        pytest.skip("no Chromium")
    old = build_site.CONF.replace('nb_render_markdown_format = "gfm"', "")
    assert old != build_site.CONF
    monkeypatch.setattr(build_site, "CONF", old)
    site = tmp_path / "site"
    assert build_site.main(["--outputs", str(executed), "--out", str(site)]) == 0
    raw = problems_of(site, "raw-table", tmp_path, only=["01_data.html"])
    assert [p.page for p in raw] == ["01_data.html"]
    (site / "bad.html").write_text(
        '<html lang="en"><body><article><img src="_images/course-figure.png">'
        '<a href="https://colab.research.google.com/github/<your-github-user>/medaidet">x</a>'
        "</article></body></html>", encoding="utf-8")
    found = {(p.page, p.kind) for p in check_site.check(site, tmp_path / "shots", ["bad.html"])}
    assert {("bad.html", "figure-link"), ("bad.html", "placeholder")} <= found


def test_a_notebook_cannot_put_a_script_or_a_local_file_on_a_page(capsys):
    text = ("A <script>alert(1)</script> and <img src=x onerror=alert(1)>, kept: H<sub>2</sub>O, "
            "`<split>` in code, ROOT/<split>.txt.\n![secret](../../../../etc/passwd) "
            "[a key](/root/.ssh/id_rsa) [next](05_counting.ipynb) [web](https://example.org)\n"
            "```\n<script>in a fence</script>\n```\n")
    safe = build_site.safe_markdown(text, "test.ipynb, cell 1")
    assert "<script>" not in safe.split("```")[0] and "&lt;script>" in safe
    assert "&lt;img src=x" in safe and "H<sub>2</sub>O" in safe and "`<split>`" in safe
    assert "passwd" not in safe and "id_rsa" not in safe and "a key" in safe
    assert "[next](05_counting.ipynb)" in safe and "[web](https://example.org)" in safe
    assert "```\n<script>in a fence</script>\n```" in safe       # code is shown as written
    err = capsys.readouterr().err
    assert "../../../../etc/passwd" in err and "test.ipynb, cell 1" in err


@pytest.mark.slow(seconds=15)
def test_the_site_publishes_only_the_course_into_its_own_folder(tmp_path, capsys):
    pytest.importorskip("sphinx")
    secret = tmp_path / "secret.png"
    secret.write_bytes(base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
                                        "mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="))
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"# 01 · A run\n\n![x]({'../' * 12}{str(secret).lstrip('/')}) <script>alert(1)</script>")])
    html_out = nbformat.v4.new_code_cell("1", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/html": "<p onmouseover=alert(1)>hi</p>", "text/plain": "hi"})])
    nb.cells.append(html_out)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(outputs / "01_data.ipynb"))
    users = tmp_path / "users"
    users.mkdir()
    (users / "index.html").write_text("the user's page")
    assert build_site.main(["--outputs", str(outputs), "--out", str(users)]) == 2
    assert (users / "index.html").read_text() == "the user's page"
    assert "not one this command made" in capsys.readouterr().err
    site = tmp_path / "site"
    assert build_site.main(["--outputs", str(outputs), "--out", str(site)]) == 0
    page = (site / "01_data.html").read_text(encoding="utf-8")
    assert "<script>alert" not in page and "onmouseover" not in page
    assert all(p.read_bytes() != secret.read_bytes() for p in site.rglob("*.png"))
    assert (site / build_site.SITE_MARKER).is_file()
    assert build_site.main(["--outputs", str(outputs), "--out", str(site)]) == 0   # its own: again
