"""`pip install medaidet[deploy]` in a fresh venv that has never seen chainer: count-image works."""
import json
import shutil
import subprocess

import pytest

from medaidet.extras.deploy import OnnxDetector, export_onnx, read_rgb
from medaidet.ssd.weights import shipped_weights

from conftest import REPO, python312


@pytest.mark.slow(seconds=20)
def test_count_image_in_a_venv_without_chainer(tmp_path, bccd_root):
    interpreter = python312()
    if not interpreter:
        pytest.skip("no Python 3.12 (pyenv or PATH)")
    model = export_onnx(shipped_weights("ssd_small"), tmp_path / "model.onnx").path
    venv = tmp_path / "venv"
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile",
                           "--disable-pip-version-check", "-e", f"{REPO}[deploy]"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("chainer", "chainercv", "cupy", "onnx"):
        probe = subprocess.run([str(python), "-c", f"import {name}"], capture_output=True)
        assert probe.returncode != 0, f"{name} is importable in the deploy venv"

    images = sorted((bccd_root / "JPEGImages").glob("*.jpg"))[:3]
    done = subprocess.run([str(python), "-m", "medaidet", "count-image", *map(str, images),
                           "--model", str(model), "--json"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    detector = OnnxDetector(model)          # this environment: chainer's neighbour
    for result, image in zip(json.loads(done.stdout), images):
        assert result["counts"] == detector.count(read_rgb(image)), image.name
    shutil.rmtree(venv, ignore_errors=True)
