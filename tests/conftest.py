"""Shared test helpers, and the split of the slow tests between two test runs."""
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What the loader drops on BCCD (found by the validator, checked by eye): (id, object) -> kind.
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

# Ten real images in which the validator finds nothing (10: its class checks are on); in BCCD's
# splits, 00000 and 00002 are val, 00007 test, the other seven train.
CLEAN_IDS = tuple(f"BloodImage_{n:05d}" for n in (0, *range(2, 11)))


# `make test` runs the suite under two interpreters. With MEDAIDET_TEST_SHARD=K/N, tests marked
# ``slow(seconds=S)`` (S: one case's time in CI, from --durations) and all tests of the
# INTERPRETER_FREE modules run in shard K only: whole modules, largest first, each to the shard
# with the least so far. Every other test runs in both; without the variable, everything runs.
SHARD_ENV = "MEDAIDET_TEST_SHARD"
INTERPRETER_FREE = ("tests/lint/", "tests/cli/", "tests/test_workflows.py",
                    "tests/test_makefile.py", "tests/test_notebooks.py",
                    "tests/test_japanese_edition.py", "tests/test_saved_code.py",
                    "tests/test_site.py", "tests/test_scripts.py", "tests/test_layers.py",
                    "tests/test_package_size.py",
                    "tests/test_exercises.py", "tests/test_downloads.py",
                    "tests/data/test_data_download.py", "tests/deploy/test_web_page.py")
FAST_TEST_SECONDS = 0.2       # the cost a fast test of those modules counts for


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"slow(seconds): a test that takes about that long on a 2-core CPU; "
                   f"${SHARD_ENV}=K/N runs it in one shard of N only")


def _shard(text):
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        k = n = -1
    if not 0 <= k < n:
        raise pytest.UsageError(f"{SHARD_ENV} must be K/N with 0 <= K < N, e.g. 0/2; "
                                f"got {text!r}")
    return k, n


def pytest_collection_modifyitems(config, items):
    _select_shard(items, config)
    needing = [item for item in items if "bccd_root" in getattr(item, "fixturenames", ())]
    if needing and _BCCD.get("root") is None:
        pytest.exit(f"{len(needing)} of the {len(items)} tests selected read BCCD, and there "
                    f"is no copy:\n{_BCCD.get('why')}\n`make test` provisions it first; running "
                    "pytest directly, set MEDAIDET_DATA or run `python -m medaidet data "
                    "download` first.", returncode=4)


def _select_shard(items, config):
    text = os.environ.get(SHARD_ENV)
    if not text:
        return
    k, n = _shard(text)
    def sharded(item):
        rel = Path(str(item.fspath)).relative_to(REPO).as_posix()
        return item.get_closest_marker("slow") is not None or rel.startswith(INTERPRETER_FREE)

    cost = defaultdict(float)
    for item in items:
        if sharded(item):
            marker = item.get_closest_marker("slow")
            cost[item.module.__name__] += (marker.kwargs.get("seconds", 10) if marker
                                           else FAST_TEST_SECONDS)
    load, owner = [0.0] * n, {}
    for module in sorted(cost, key=lambda m: (-cost[m], m)):
        owner[module] = load.index(min(load))
        load[owner[module]] += cost[module]
    keep, other = [], []
    for item in items:
        mine = not sharded(item) or owner[item.module.__name__] == k
        (keep if mine else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = keep


def pytest_report_header(config):
    text = os.environ.get(SHARD_ENV)
    if text:
        return (f"{SHARD_ENV}={text}: slow and interpreter-free tests of shard {text} only "
                "(the rest run elsewhere)")


def npm_ci(folder: Path, package: str, missing) -> None:
    """``npm ci`` unless node_modules/``package`` exists; ``missing(why)`` without npm."""
    if (folder / "node_modules" / package).is_dir():
        return
    if shutil.which("npm") is None:
        missing(f"npm is not installed, and {folder.name}/node_modules is missing")
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def fake_distribution(site: Path, name: str, version: str) -> Path:
    """Make ``importlib.metadata`` see ``name==version`` installed under ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def split_ids(root: Path, split: str) -> list:
    """The image ids of ``ImageSets/Main/<split>.txt`` under ``root``."""
    return (Path(root) / "ImageSets" / "Main" / f"{split}.txt").read_text().split()


def write_split(root: Path, split: str, ids) -> None:
    """Write ``ImageSets/Main/<split>.txt`` under ``root``: one id a line."""
    (Path(root) / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))


def remove_object(annotation, obj):
    annotation.remove(obj)


def edit_objects(root: Path, image_ids, change=remove_object) -> None:
    """``change(annotation, obj)`` for every <object> of ``image_ids`` (default: remove it)."""
    import xml.etree.ElementTree as ET
    for image_id in image_ids:
        path = Path(root) / "Annotations" / f"{image_id}.xml"
        tree = ET.parse(path)
        for obj in tree.getroot().findall("object"):
            change(tree.getroot(), obj)
        tree.write(path)


def run_python(code: str, extra_path=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, ``extra_path`` first on PYTHONPATH (fake packages)."""
    full_env = dict(os.environ, **(env or {}))
    paths = [str(p) for p in (extra_path or [])] + [str(REPO)]
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


@pytest.fixture(autouse=True)
def fresh_annotation_reports():
    """The loader shows a split's report once per process; each test sees it afresh."""
    bccd = sys.modules.get("medaidet.data.bccd")
    if bccd is not None:
        bccd._REPORTED.clear()
    yield


def _find_bccd():
    """``(root, None)`` where the package finds BCCD ($MEDAIDET_DATA > cache), else (None, why)."""
    from medaidet.data.download import resolve_root
    from medaidet.errors import DataError
    try:
        return resolve_root(), None
    except DataError as missing:
        return None, str(missing)


def _find_txl():
    """TXL-PBC as the package finds it, else ``../shared/txl-pbc`` (CI's), else None."""
    from medaidet.data.download import TXL_PBC, resolve_root
    from medaidet.errors import DataError
    try:
        return resolve_root(source=TXL_PBC)
    except DataError:
        shared = REPO.parent / "shared" / "txl-pbc"
        return shared.resolve() if (shared / "TXL_PBC").is_dir() else None


# Caller variables that change what medaidet does: unset for the session, except MEDAIDET_DATA,
# set to the BCCD copy found, so a command without --root reads the same data everywhere.
CALLER_VARIABLES = ("MEDAIDET_DATA", "MEDAIDET_BCCD_URL", "MEDAIDET_TXL_PBC",
                    "MEDAIDET_TXL_PBC_URL", "MEDAIDET_NOTEBOOKS",
                    "MEDAIDET_PROFILE", "MEDAIDET_COURSE_RUN", "MEDAIDET_COURSE_OUT",
                    "MEDAIDET_REPO", "MEDAIDET_COLAB_DIR", "MEDAIDET_QUIET_ANNOTATIONS")
_BCCD = {}
_SESSION_ENV = {}


def pytest_sessionstart(session):
    # Before test modules are imported: chainer reads CHAINER_DATASET_ROOT at import, and a
    # user's cached pretrained weights (~/.chainer/dataset) must not change offline tests.
    _BCCD["root"], _BCCD["why"] = _find_bccd()
    _BCCD["tmp"] = Path(tempfile.mkdtemp(prefix="medaidet-tests-"))
    (_BCCD["tmp"] / "chainer-dataset").mkdir()
    for name in CALLER_VARIABLES:
        os.environ.pop(name, None)
    # without a copy: a folder that does not exist, so no test finds one by accident
    _SESSION_ENV["MEDAIDET_DATA"] = str(_BCCD["root"] or _BCCD["tmp"] / "no-bccd")
    _BCCD["txl"] = _find_txl()
    _SESSION_ENV["MEDAIDET_TXL_PBC"] = str(_BCCD["txl"] or _BCCD["tmp"] / "no-txl-pbc")
    _SESSION_ENV["CHAINER_DATASET_ROOT"] = str(_BCCD["tmp"] / "chainer-dataset")
    os.environ.update(_SESSION_ENV)


def pytest_sessionfinish(session):
    if "tmp" in _BCCD:
        shutil.rmtree(_BCCD["tmp"], ignore_errors=True)


@pytest.fixture(autouse=True)
def hermetic_environment(monkeypatch):
    """Each test starts from the session's environment, whatever an earlier test left."""
    for name in CALLER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in _SESSION_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def txl_root() -> Path:
    """The real TXL-PBC copy; tests needing it skip without it, or fail with CI_REQUIRE_TXL=1."""
    if _BCCD["txl"] is None:
        why = "TXL-PBC is in neither $MEDAIDET_TXL_PBC, the cache nor ../shared/txl-pbc"
        if os.environ.get("CI_REQUIRE_TXL") == "1":
            pytest.fail(why + " (CI requires it)")
        pytest.skip(why)
    return _BCCD["txl"]


@pytest.fixture(scope="session")
def bccd_root() -> Path:
    """The real BCCD copy: ``$MEDAIDET_DATA``, else the cache (where ``make test`` puts it)."""
    return _BCCD["root"]    # found: without it, no test that needs it is run


@pytest.fixture
def bccd_copy(bccd_root, tmp_path):
    """``bccd_copy(ids=CLEAN_IDS, splits=None)``: a root under tmp_path with the real BCCD images
    and annotations of ``ids``, and split lists ``{split: ids}`` (default: each id in its BCCD
    splits, every list written, empty or not)."""
    def make(ids=CLEAN_IDS, splits=None):
        base = tmp_path / "bccd"
        (base / "ImageSets" / "Main").mkdir(parents=True)
        for folder, suffix in (("Annotations", "xml"), ("JPEGImages", "jpg")):
            (base / folder).mkdir()
            for image_id in ids:
                shutil.copy(bccd_root / folder / f"{image_id}.{suffix}", base / folder)
        if splits is None:
            splits = {split: [i for i in split_ids(bccd_root, split) if i in ids]
                      for split in ("train", "val", "trainval", "test")}
        for split, listed in splits.items():
            write_split(base, split, listed)
        return base
    return make


@pytest.fixture
def site_dir(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    return site


def python312():
    """A Python 3.12 (pyenv's, else PATH's, else None) for tests that build a fresh venv."""
    import glob
    import shutil

    found = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12"))
    return found[-1] if found else shutil.which("python3.12")


@pytest.fixture
def no_prediction(monkeypatch):
    """Fails the test if the model is built: an evaluate/count run's checks come first."""
    import medaidet.evaluation.evaluate as evaluate_module

    def forbidden(*args, **kwargs):
        raise AssertionError("the model was built before the arguments were checked")
    monkeypatch.setattr(evaluate_module, "load_model", forbidden)
