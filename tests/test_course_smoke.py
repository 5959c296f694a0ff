"""The whole course, every notebook in notebooks/, runs under the runner in the smoke profile."""
import json

import nbformat

from medaidet.course import default_notebooks_dir, list_notebooks, run_course


def test_every_notebook_runs_in_the_smoke_profile(tmp_path, monkeypatch, bccd_root):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))  # the kernels read the data from here
    summary = run_course(profile="smoke", out_dir=tmp_path, log=lambda *_: None)
    statuses = {r.name: (r.status, r.error) for r in summary.results}
    assert summary.ok, statuses
    names = [p.stem for p in list_notebooks(default_notebooks_dir())]
    assert list(statuses) == names
    assert {"00_environment", "01_data", "02_model_and_loss"} <= set(names)
    for name in names:
        executed = nbformat.read(str(tmp_path / f"{name}.ipynb"), as_version=4)
        outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
        assert outputs and not [o for o in outputs if o.output_type == "error"], name
    assert json.loads((tmp_path / "summary.json").read_text())["profile"] == "smoke"


def test_data_notebook_plots_and_reports(tmp_path, monkeypatch, bccd_root):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    summary = run_course(profile="smoke", only=["01"], out_dir=tmp_path, log=lambda *_: None)
    assert summary.ok, summary.results
    executed = nbformat.read(str(tmp_path / "01_data.ipynb"), as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    text = "".join(o.get("text", "") for o in outputs)
    assert len(figures) >= 5  # class balance, box sizes, samples, flagged objects, image pairs
    assert "every file matches" in text
    assert "zero_area" in text and "near_duplicate_image" in text


def test_model_and_loss_notebook_shows_the_named_error(tmp_path, monkeypatch, bccd_root):
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    summary = run_course(profile="smoke", only=["02"], out_dir=tmp_path, log=lambda *_: None)
    assert summary.ok, summary.results
    executed = nbformat.read(str(tmp_path / "02_model_and_loss.ipynb"), as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 2
    assert "ChainerCV : IndexError" in text            # the unhelpful original
    assert "ChainerCV : no error; loss = nan" in text  # the silent one
    assert text.count("medaidet  : InvalidTargetsError") == 2
    assert "every ground-truth box recovered" in text
