"""Snapshots and resume: the trainer's state on disk, and the files a run starts from.

``snapshot_latest.npz`` holds the whole trainer (model, optimizer state, iterator position,
the log) and, through :class:`RandomStateExtension`, Python's and NumPy's global random
states, which chainer's own trainer snapshot leaves out: with them a resumed run sees the
same batches and augmentation as an uninterrupted one (bitwise identical on the CPU without
worker processes, see :mod:`medaidet.training.seeding`).

The files a run starts from are checked before any model or data is built
(:func:`check_snapshot_file`, :func:`check_weights_file`: the zip directory only), and the
snapshot again against the built trainer (:func:`load_snapshot`); each problem is one
named error that says which file, what it is and what was expected.
"""
from __future__ import annotations

import math
import random
import zipfile
import zlib
from pathlib import Path

import chainer
import numpy as np

from medaidet.errors import WeightsError
from medaidet.ssd.weights import check_sizes, what_file_is

__all__ = ["SNAPSHOT_NAME", "RandomStateExtension", "check_snapshot_file",
           "check_weights_file", "load_snapshot", "snapshot_iteration"]

SNAPSHOT_NAME = "snapshot_latest.npz"
SNAPSHOT_EXPECTED = "the snapshot_latest.npz of a medaidet train run (in its output folder)"
WEIGHTS_EXPECTED = ("imagenet, voc0712, none or a model-only .npz (the model.npz of a "
                    "medaidet train run)")


class RandomStateExtension:
    """Puts Python's and NumPy's global random states into the trainer snapshot.

    Chainer's trainer snapshot restores the model, the optimizer and the iterator position
    but not the random states that shuffle the data (NumPy) and draw the augmentation
    (Python's ``random``): without them a resumed run sees other batches than an
    uninterrupted one. Also records the training set size and batch size, so a snapshot
    taken with another dataset is refused with a clear message. Never triggered itself;
    only its ``serialize`` matters.
    """

    name = "train_state"
    trigger = (10 ** 12, "iteration")
    priority = 0

    def __init__(self, train_size: int, batch_size: int):
        self.train_size = int(train_size)
        self.batch_size = int(batch_size)

    def __call__(self, trainer):
        pass

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            version, internal, gauss = random.getstate()
            serializer("python_version", np.int64(version))
            serializer("python_state", np.asarray(internal, dtype=np.int64))
            serializer("python_gauss", np.float64(np.nan if gauss is None else gauss))
            kind, keys, pos, has_gauss, cached = np.random.get_state()
            serializer("numpy_keys", np.asarray(keys, dtype=np.uint32))
            serializer("numpy_pos", np.int64(pos))
            serializer("numpy_has_gauss", np.int64(has_gauss))
            serializer("numpy_cached_gaussian", np.float64(cached))
            serializer("train_size", np.int64(self.train_size))
            serializer("batch_size", np.int64(self.batch_size))
            return
        # loading: restore
        internal = serializer("python_state", None)
        version = int(serializer("python_version", None))
        gauss = float(serializer("python_gauss", None))
        random.setstate((version, tuple(int(v) for v in internal),
                         None if math.isnan(gauss) else gauss))
        np.random.set_state(("MT19937", np.asarray(serializer("numpy_keys", None),
                                                   dtype=np.uint32),
                             int(serializer("numpy_pos", None)),
                             int(serializer("numpy_has_gauss", None)),
                             float(serializer("numpy_cached_gaussian", None))))


def _npz_entries(path: Path, name: str, expected: str, kind: str) -> list:
    """The array names in the ``.npz`` at ``path`` (its zip directory only: no array is
    read). Raises a :class:`~medaidet.errors.WeightsError` of ``kind`` naming ``name`` when
    it is missing, a folder, not a zip (what it is instead:
    :func:`medaidet.ssd.weights.what_file_is`) or truncated."""
    def fail(problem):
        return WeightsError(f"{name}: {path} {problem}; expected {expected}", kind, path=path)

    if not path.exists():
        raise fail("does not exist")
    if path.is_dir():
        raise fail("is a folder")
    try:
        what = what_file_is(path)
        if what is not None:
            raise fail(f"is {what}")
        with zipfile.ZipFile(path) as archive:
            return [entry[:-4] if entry.endswith(".npy") else entry
                    for entry in archive.namelist()]
    except zipfile.BadZipFile as exc:
        raise fail(f"is truncated or corrupt ({exc})") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None


def check_snapshot_file(path, name: str = "resume") -> Path:
    """``path`` if it looks like a trainer snapshot (an ``.npz`` with ``updater/``
    entries), else a ``"snapshot"`` WeightsError naming ``name`` (the argument as the user wrote
    it: ``--resume`` on the command line). Reads only the zip directory; whether the
    snapshot fits the config is checked once the data are built."""
    path = Path(path)
    entries = _npz_entries(path, name, SNAPSHOT_EXPECTED, "snapshot")
    if not any(entry.startswith("updater/") for entry in entries):
        raise WeightsError(f"{name}: {path} is not a trainer snapshot (no 'updater/' entries); "
                           f"expected {SNAPSHOT_EXPECTED}; to start from model weights use "
                           "pretrained=PATH (--pretrained PATH) instead", "snapshot")
    return path


def check_weights_file(path, name: str = "pretrained") -> Path:
    """``path`` if it looks like a model-only weight file (an ``.npz``), else
    a ``"missing"`` WeightsError or
    a ``"file"`` WeightsError naming ``name``. Reads only the zip
    directory; :func:`medaidet.ssd.weights.load_weights` checks every array when it loads."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{name}: {path} does not exist; expected "
                           f"{WEIGHTS_EXPECTED}", "missing", path=path)
    entries = _npz_entries(path, name, WEIGHTS_EXPECTED, "file")
    if any(entry.startswith("updater/") for entry in entries):
        raise WeightsError(f"{name}: {path} is a trainer snapshot, not model weights; "
                           f"expected {WEIGHTS_EXPECTED}; to continue that run use "
                           "resume=PATH (--resume PATH)", "file")
    return path


def load_snapshot(trainer, path, train_size: int, batch_size: int) -> None:
    """Restore ``trainer`` (and the random states) from the snapshot at ``path``, after
    checking that it was taken on ``train_size`` images with ``batch_size``:
    a ``"snapshot"`` WeightsError otherwise, or when it does not fit this trainer's model."""
    path = Path(path)
    _check_fits(path, train_size, batch_size)
    try:
        chainer.serializers.load_npz(str(path), trainer)
    except (KeyError, ValueError, TypeError) as exc:
        raise WeightsError(f"{path} does not fit this trainer ({type(exc).__name__}: "
                           f"{exc}): was it taken with another model or config?",
                           "snapshot") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is truncated or corrupt ({type(exc).__name__}: "
                           f"{exc}); expected {SNAPSHOT_EXPECTED}", "snapshot") from None


def _check_fits(path: Path, train_size: int, batch_size: int) -> None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            check_sizes(path, npz.zip)          # before chainer reads every array of it
            keys = set(npz.files)
            prefix = f"extensions/{RandomStateExtension.name}/"
            if not any(k.startswith("updater/") for k in keys):
                raise WeightsError(f"{path} is not a trainer snapshot (no 'updater/' entries); "
                                   "to start from model weights use pretrained=PATH instead",
                                   "snapshot")
            if prefix + "train_size" not in keys:
                raise WeightsError(f"{path} was not written by medaidet train (it lacks the "
                                   "random states); it cannot be resumed here", "snapshot")
            size, batch = int(npz[prefix + "train_size"]), int(npz[prefix + "batch_size"])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise WeightsError(f"{path} is not a readable trainer snapshot ({type(exc).__name__}: "
                           f"{exc}); expected {SNAPSHOT_EXPECTED}", "snapshot") from None
    if (size, batch) != (train_size, batch_size):
        raise WeightsError(
            f"{path} was taken training on {size} images with batch size {batch}; this "
            f"config has {train_size} images and batch size {batch_size}. A trainer snapshot "
            "holds the iterator's position in that dataset: resume with the same subset and "
            "batch size, or start a new run from its model weights "
            "(pretrained='.../model.npz').", "snapshot")


def snapshot_iteration(path: Path):
    """The iteration the snapshot at ``path`` was taken at, or None (no readable one)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return int(npz["updater/iteration"])
    except (OSError, KeyError, ValueError):
        return None
