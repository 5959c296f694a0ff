"""tools/build_site.py (`make site`): the course's website from executed notebooks.

The real build from a smoke run, read in Chromium, is tools/check_site.py in .ci/run (after
the course ran); here: what the builder does to the notebooks and links, a whole build of the
committed notebooks (no outputs, so fast), and the message when there is nothing to build.
"""
import sys

import nbformat
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import build_site  # noqa: E402  (tools/ is no package)


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


@pytest.mark.slow(seconds=16)
def test_both_editions_build_with_twins_colab_and_downloads(tmp_path):
    pytest.importorskip("sphinx")
    outputs = tmp_path / "outputs"        # the English edition "run"; the Japanese not
    outputs.mkdir()
    for notebook in (REPO / "notebooks").glob("0[34]_*.ipynb"):
        (outputs / notebook.name).write_bytes(notebook.read_bytes())
    site = tmp_path / "site"
    assert build_site.main(["--outputs", str(outputs), "--out", str(site)]) == 0
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
