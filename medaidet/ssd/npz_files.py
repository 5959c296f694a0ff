"""An ``.npz`` someone hands us, read as untrusted data (notebook 03's weights, notebook 09).

:func:`read_arrays` reads every array of a ChainerCV/medaidet ``.npz`` without unpickling
anything (``allow_pickle=False``); a file that is not one raises a ``"file"``
:class:`~medaidet.errors.WeightsError` saying what it is instead (:func:`what_file_is`:
empty, a tar or gzip archive, a pickle, HDF5, text, ...), truncated or damaged, and what
was expected. :func:`check_finite` refuses arrays holding NaN or inf, which would load
without complaint and make a model that detects nothing.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from medaidet.errors import WeightsError

__all__ = ["what_file_is", "read_arrays", "check_finite"]

_EXPECTED = ("expected a ChainerCV/medaidet .npz: a zip of .npy arrays, one per parameter, as "
             "medaidet.ssd.weight_files.save_weights (the model.npz of `medaidet train`) or "
             "chainer.serializers.save_npz writes it")
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip's first entry; an empty zip


_NOT_A_ZIP = [  # (leading bytes, what the file is)
    (b"\x93NUMPY", "a single NumPy array (.npy, as numpy.save writes it)"),
    (b"\x1f\x8b", "a gzip-compressed file (a .tar.gz or .gz archive?)"),
    (b"BZh", "a bzip2-compressed file"),
    (b"\xfd7zXZ\x00", "an xz-compressed file"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (chainer.serializers.save_hdf5 or Keras weights?)"),
    (b"\x80", "a Python pickle (pickle.dump or an old torch.save?)"),
]


def what_file_is(path: Path) -> str | None:
    """What ``path`` holds, in words, when it is not a zip archive (``None`` when it is)."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "empty (0 bytes)"
    if any(magic.startswith(head[:4]) for magic in _ZIP_MAGIC):
        return None
    if len(head) > 262 and head[257:262] == b"ustar":
        return "a tar archive"
    for magic, what in _NOT_A_ZIP:
        if head.startswith(magic):
            return what
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:  # maybe cut inside a character: try without the last 3 bytes
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            text = None
    if text is not None and "\x00" not in text:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"a text file (it begins {first!r})"
    return f"not an .npz (it begins with the bytes {head[:8].hex(' ')})"


def read_arrays(path: Path) -> dict:
    """Every array of the ``.npz`` at ``path``, by name. Anything else raises
    a ``"file"`` WeightsError saying what the file is and what was expected."""
    what = what_file_is(path)
    if what is not None:
        if what.startswith("empty"):
            raise WeightsError(
                f"{path} is empty (0 bytes): the save or copy that wrote it did not finish "
                f"(an interrupted run, a full disk?); copy it again or use another file; "
                f"{_EXPECTED}.", "file")
        raise WeightsError(f"{path} is {what}, not a weight file; {_EXPECTED}.", "file")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        # it starts as a zip; the table of contents at its end is missing
        size = path.stat().st_size
        raise WeightsError(
            f"{path} is a truncated .npz: it starts as a zip archive but its end is missing "
            f"({size} byte{'' if size == 1 else 's'} long; an interrupted copy, download or "
            f"save, or a full disk). Copy or download it again, or save it again with "
            f"medaidet.ssd.weight_files.save_weights.", "file") from None
    with npz:
        members = npz.zip.namelist()
        other = [m for m in members if not m.endswith(".npy")]
        if other:
            raise WeightsError(
                f"{path} is a zip archive but not an .npz of arrays: it holds {other[0]!r}"
                f"{f' and {len(other) - 1} more' if len(other) > 1 else ''}, which is not a "
                f".npy array (a PyTorch checkpoint or another tool's archive?); {_EXPECTED}.",
                "file")
        if not members:
            raise WeightsError(f"{path} is an empty zip archive: no arrays; {_EXPECTED}.", "file")
        arrays = {}
        for key in npz.files:
            try:
                arrays[key] = npz[key]
            except ValueError as exc:
                if "allow_pickle" not in str(exc) and "Object arrays" not in str(exc):
                    raise _damaged(path, key, exc) from None
                raise WeightsError(
                    f"{path}: entry {key} holds Python objects, not numbers; a parameter "
                    f"saved before the model's first forward pass is one cause. Save with "
                    f"medaidet.ssd.weight_files.save_weights.", "file") from None
            except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise _damaged(path, key, exc) from None
    return arrays


def _damaged(path: Path, key: str, exc: Exception) -> WeightsError:
    return WeightsError(
        f"{path} is damaged: its entry {key} cannot be read ({exc}). Copy or download it "
        f"again, or save it again with medaidet.ssd.weight_files.save_weights.", "file")


def check_finite(arrays: dict, path: Path, cause: str) -> None:
    """Raise a ``"not_finite"`` WeightsError if a floating-point array holds NaN or inf:
    such weights load without complaint and the model then predicts nothing."""
    bad = [key for key in sorted(arrays) if np.asarray(arrays[key]).dtype.kind in "fc"
           and not np.isfinite(arrays[key]).all()]
    if not bad:
        return
    key = bad[0]
    array = np.asarray(arrays[key])
    n_nan, n_inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    raise WeightsError(
        f"{path}: parameter {key} holds {n_nan} NaN and {n_inf} infinite of its {array.size} "
        f"values ({len(bad)} of {len(arrays)} arrays hold NaN or inf; the first in name "
        f"order is shown). A model with these weights detects nothing. Likely cause: "
        f"{cause}.", "not_finite", path=path, parameter=key, count=len(bad))

