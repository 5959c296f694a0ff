"""An ``.npz`` someone hands us, read as untrusted data (notebook 03's weights, notebook 09).

:func:`read_arrays` reads every array of a ChainerCV/medaidet ``.npz`` without unpickling
anything (``allow_pickle=False``); a file that is not one raises a ``"file"``
:class:`~medaidet.errors.WeightsError` saying what it is instead (:func:`what_file_is`:
empty, a tar or gzip archive, a pickle, HDF5, text, ...), truncated or damaged, and what
was expected. Before any array is read, :func:`check_sizes` holds every member's declared
size (the zip's, and the shape its ``.npy`` header declares) to :data:`MAX_ARRAY_BYTES` and
all of them to :data:`MAX_TOTAL_BYTES`: a small file that inflates to gigabytes, or declares
an array it does not hold, raises a ``"too_large"`` or ``"file"`` WeightsError before any
memory is taken. :func:`check_finite` refuses arrays holding NaN or inf, which would load
without complaint and make a model that detects nothing.
"""
from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from medaidet.errors import WeightsError
from medaidet.files import not_a_regular_file

__all__ = ["MAX_ARRAY_BYTES", "MAX_TOTAL_BYTES", "what_file_is", "check_sizes", "read_arrays",
           "check_finite"]

#: The largest array a weight file may hold (SSD512's largest, 1024 x 512 x 3 x 3 float32,
#: is 18 MiB), and all of its arrays together (SSD512's whole model is about 110 MiB; a
#: trainer snapshot with Adam's two moments about three times that).
MAX_ARRAY_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 1 * 2**30

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
    why = not_a_regular_file(path)
    if why:
        return why
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


def check_sizes(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse ``archive`` (the open zip of the ``.npz`` at ``path``) when a member declares
    more than :data:`MAX_ARRAY_BYTES`, all of them more than :data:`MAX_TOTAL_BYTES`
    (``"too_large"``), or a member's ``.npy`` header declares an array of another size than
    the member holds (``"file"``). Only the zip's directory and each header are read."""
    total = 0
    for info in archive.infolist():
        total += info.file_size
        if info.file_size > MAX_ARRAY_BYTES or total > MAX_TOTAL_BYTES:
            what = (f"its entry {info.filename} inflates to {info.file_size:,} bytes"
                    if info.file_size > MAX_ARRAY_BYTES else
                    f"its entries inflate to more than {total:,} bytes together")
            raise WeightsError(
                f"{path}: {what}, more than any model's weights (limits: "
                f"{MAX_ARRAY_BYTES:,} bytes per array, {MAX_TOTAL_BYTES:,} in all); not "
                f"read. {_EXPECTED}.", "too_large", path=path, parameter=info.filename)
        if not info.filename.endswith(".npy"):
            continue
        with archive.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
                header = f.tell()
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise _damaged(path, info.filename, exc) from None
        declared = math.prod(shape) * dtype.itemsize
        if not dtype.hasobject and header + declared != info.file_size:
            raise WeightsError(
                f"{path}: its entry {info.filename} declares an array of shape {shape} "
                f"({declared:,} bytes) but holds {info.file_size - header:,}: damaged or "
                f"made to mislead; not read. {_EXPECTED}.", "file", path=path,
                parameter=info.filename)


def read_arrays(path: Path) -> dict:
    """Every array of the ``.npz`` at ``path``, by name. Anything else raises
    a ``"file"`` WeightsError saying what the file is and what was expected."""
    what = what_file_is(path)
    if what is not None:
        if what.startswith("empty"):
            raise WeightsError(
                f"{path} is empty (0 bytes): the save or copy that wrote it did not finish "
                f"(an interrupted run, a full disk?); copy it again or use another file; "
                f"{_EXPECTED}.", "file", path=path)
        raise WeightsError(f"{path} is {what}, not a weight file; {_EXPECTED}.", "file",
                           path=path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        # it starts as a zip; the table of contents at its end is missing
        size = path.stat().st_size
        raise WeightsError(
            f"{path} is a truncated .npz: it starts as a zip archive but its end is missing "
            f"({size} byte{'' if size == 1 else 's'} long; an interrupted copy, download or "
            f"save, or a full disk). Copy or download it again, or save it again with "
            f"medaidet.ssd.weight_files.save_weights.", "file", path=path) from None
    with npz:
        check_sizes(path, npz.zip)
        members = npz.zip.namelist()
        other = [m for m in members if not m.endswith(".npy")]
        if other:
            raise WeightsError(
                f"{path} is a zip archive but not an .npz of arrays: it holds {other[0]!r}"
                f"{f' and {len(other) - 1} more' if len(other) > 1 else ''}, which is not a "
                f".npy array (a PyTorch checkpoint or another tool's archive?); {_EXPECTED}.",
                "file", path=path)
        if not members:
            raise WeightsError(f"{path} is an empty zip archive: no arrays; {_EXPECTED}.",
                               "file", path=path)
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
                    f"medaidet.ssd.weight_files.save_weights.", "file", path=path) from None
            except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise _damaged(path, key, exc) from None
    return arrays


def _damaged(path: Path, key: str, exc: Exception) -> WeightsError:
    return WeightsError(
        f"{path} is damaged: its entry {key} cannot be read ({exc}). Copy or download it "
        f"again, or save it again with medaidet.ssd.weight_files.save_weights.", "file",
        path=Path(path), parameter=key)


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

