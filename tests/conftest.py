"""Shared test helpers."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What the loader drops on BCCD (found by the validator, checked by eye):
# (image id, object index) -> kind.
BCCD_DROPPED = {
    ("BloodImage_00338", 12): "zero_area",
    ("BloodImage_00343", 3): "zero_area",
    ("BloodImage_00020", 14): "near_duplicate_box",
    ("BloodImage_00100", 2): "near_duplicate_box",
    ("BloodImage_00104", 13): "near_duplicate_box",
    ("BloodImage_00251", 7): "near_duplicate_box",
    ("BloodImage_00284", 1): "near_duplicate_box",
    ("BloodImage_00331", 2): "near_duplicate_box",
    ("BloodImage_00403", 3): "near_duplicate_box",
}


def fake_distribution(site: Path, name: str, version: str) -> Path:
    """Make ``importlib.metadata`` see ``name==version`` installed under ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def run_python(code: str, extra_path=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment, optionally with
    ``extra_path`` first on PYTHONPATH (fake packages shadowing real ones)."""
    full_env = dict(os.environ, **(env or {}))
    paths = [str(p) for p in (extra_path or [])] + [str(REPO)]
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def bccd_root() -> Path:
    """The real BCCD copy: ``$MEDAIDET_DATA``, else ``../shared/bccd`` beside the checkout."""
    root = Path(os.environ.get("MEDAIDET_DATA") or REPO.parent / "shared" / "bccd").resolve()
    if not (root / "Annotations").is_dir():
        pytest.fail(f"BCCD not found at {root}: set MEDAIDET_DATA to a BCCD copy (VOC layout)")
    return root


@pytest.fixture
def site_dir(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    return site
