"""A load error in a worker ends the run with the named error, not a hang (Chainer's prefetch
thread dies on it); each test runs in its own session under a time limit."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import REPO

TRAIN_IDS = ("BloodImage_00001", "BloodImage_00003")
VAL_IDS = ("BloodImage_00004",)
BROKEN = TRAIN_IDS[1]
HANG_SECONDS = 240        # training: a real failure ends in seconds; a hang never does
QUICK_SECONDS = 90        # an iterator alone


@pytest.fixture
def broken_bccd(bccd_root, tmp_path):
    """Three BCCD images; one JPEG truncated to half (its size still reads, decoding fails)."""
    root = tmp_path / "bccd"
    (root / "ImageSets" / "Main").mkdir(parents=True)
    for folder in ("Annotations", "JPEGImages"):
        (root / folder).mkdir()
    for image_id in TRAIN_IDS + VAL_IDS:
        shutil.copy(bccd_root / "Annotations" / f"{image_id}.xml", root / "Annotations")
        shutil.copy(bccd_root / "JPEGImages" / f"{image_id}.jpg", root / "JPEGImages")
    for split, ids in (("train", TRAIN_IDS), ("val", VAL_IDS)):
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    jpeg = root / "JPEGImages" / f"{BROKEN}.jpg"
    data = jpeg.read_bytes()
    jpeg.write_bytes(data[:len(data) // 2])
    return root


def run_guarded(argv, timeout=HANG_SECONDS) -> subprocess.CompletedProcess:
    """Run ``argv`` in a new session; on timeout kill it (the workers too) and fail."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hung: no end after {timeout} s\nstdout:\n{out[-3000:]}\n"
                    f"stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# the end of each program below: the first batch, and what it raised
NEXT_BATCH = """
try:
    next(iterator)
except Exception as exc:
    print("ERROR", type(exc).__module__ + "." + type(exc).__qualname__, getattr(exc, "kind", None))
    print("MESSAGE", exc)
    print("WORKER", repr(exc.__cause__))
finally:
    iterator.finalize()
print("DONE")
"""


def first_batch(code, *args) -> dict:
    """What the first batch of ``code`` + NEXT_BATCH raised: {"ERROR": ..., "MESSAGE": ...}."""
    done = run_guarded([sys.executable, "-c", code + NEXT_BATCH, *args], timeout=QUICK_SECONDS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("DONE") and "Exception in thread" not in done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)

ITERATOR_CODE = """
import sys, traceback
from medaidet.data.bccd import BCCDDataset
from medaidet.training.config import TrainConfig
from medaidet.training.iterators import make_train_iterator

dataset = BCCDDataset(sys.argv[1], "train")
iterator, n = make_train_iterator(dataset, TrainConfig(batch_size=2, n_processes=2),
                                  log=print)
assert n == 2, n
"""


def test_worker_error_reaches_the_main_process_as_the_same_error(broken_bccd):
    lines = first_batch(ITERATOR_CODE, str(broken_bccd))
    assert lines["ERROR"] == "medaidet.errors.DataError image", lines
    assert f"{BROKEN}.jpg cannot be decoded" in lines["MESSAGE"]
    assert "Traceback" in lines["WORKER"] and "_get_image" in lines["WORKER"]


UNPICKLABLE_CODE = """
import threading
from medaidet.training.config import TrainConfig
from medaidet.training.iterators import make_train_iterator

class Locked(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()          # cannot be pickled to the main process

class Dataset:
    def __len__(self):
        return 4
    def __getitem__(self, i):
        if i == 2:
            raise Locked("example 2 holds a lock")
        return i

iterator, n = make_train_iterator(Dataset(), TrainConfig(batch_size=4, n_processes=2))
assert n == 2, n
"""


def test_an_error_that_cannot_travel_is_named_by_its_type_and_message():
    lines = first_batch(UNPICKLABLE_CODE)
    assert lines["ERROR"] == "medaidet.errors.DataError worker", lines
    assert "__main__.Locked: example 2 holds a lock" in lines["MESSAGE"]


@pytest.mark.slow(seconds=4)
@pytest.mark.parametrize("n_processes", ["2", "0"])
def test_train_with_a_broken_image_ends_with_the_named_error(broken_bccd, tmp_path,
                                                             n_processes):
    done = run_guarded([sys.executable, "-m", "medaidet", "train", "--profile", "smoke",
                        "--root", str(broken_bccd), "--out", str(tmp_path / "out"),
                        "--subset", "2", "--batch-size", "2", "--iterations", "1",
                        "--n-processes", n_processes, "--no-progress"])
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("medaidet: error: ") and f"{BROKEN}.jpg cannot be decoded" in last
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr
    assert not (tmp_path / "out" / "model.npz").exists()
