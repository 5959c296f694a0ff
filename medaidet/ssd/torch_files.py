"""PyTorch state-dict files (``.pth``) read as NumPy arrays, without PyTorch.

torchvision publishes its ImageNet weights as ``torch.save`` files. PyTorch is not part of
this course's stack (its Linux wheels bring gigabytes of CUDA libraries), so
:func:`read_state_dict` reads the two formats ``torch.save`` writes itself:

* the **zip** format (PyTorch 1.6 and later): ``<name>/data.pkl``, a pickle whose tensors
  refer to storages stored as raw little-endian bytes in ``<name>/data/<key>``;
* the **legacy** format (PyTorch 0.2 to 1.5, the torchvision files of 2017): a magic number,
  a protocol version and system information, each pickled, then the pickle, the list of
  storage keys, and each storage as an 8-byte element count followed by its bytes.

The pickle is read by an unpickler that knows only what a state dict holds (an
``OrderedDict``, tensors rebuilt by ``torch._utils._rebuild_tensor(_v2)`` and the storage
types): anything else in the file raises a ``"file"`` WeightsError naming it; the legacy
format's other pickles (its header and its list of storage keys) may hold plain data only. No
pickle is ever allowed to run code, and every size the file declares (an entry, a storage, a
tensor's shape, strides and offset) is checked against the bytes really there before anything
is allocated, within :data:`MAX_STATE_BYTES`. When such a file cannot be read this way and PyTorch *is*
installed, PyTorch's own safe loader (``torch.load(..., weights_only=True)``) reads it.
"""
from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np

from medaidet.errors import WeightsError

__all__ = ["read_state_dict", "is_torch_file"]

#: The first pickle of a legacy file (``torch.serialization.MAGIC_NUMBER``) and its protocol.
MAGIC_NUMBER = 0x1950a86a20f9469cfc6c
PROTOCOL_VERSION = 1001

#: The most bytes of tensors one file may hold (VGG-16, the largest file read, has 0.55 GB),
#: and the most bytes of its pickle.
MAX_STATE_BYTES = 2 << 30
MAX_PICKLE_BYTES = 64 << 20

#: Storage type -> NumPy dtype (bfloat16 is widened to float32 when the tensor is built).
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize


class _Storage:
    """A storage whose bytes are set once read (legacy files store them after the pickle)."""

    def __init__(self, kind: _StorageType, numel: int):
        self.kind, self.numel = kind, int(numel)
        self.data: np.ndarray | None = None
        if not 0 <= self.numel * kind.itemsize <= MAX_STATE_BYTES:
            raise WeightsError(f"a storage declares {self.numel} elements of {kind.name}: "
                               f"negative, or more than {MAX_STATE_BYTES} bytes; the file is "
                               "damaged or not a state dict of weights", "file")

    def set_bytes(self, raw: bytes, path: Path, key: str) -> None:
        if len(raw) != self.numel * self.kind.itemsize:
            raise WeightsError(
                f"{path}: storage {key} holds {len(raw)} bytes, its header says "
                f"{self.numel} x {self.kind.itemsize}: the file is truncated or damaged; "
                f"download it again.", "file")
        if self.kind.dtype == "bfloat16":  # the upper 16 bits of a float32
            self.data = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            self.data = np.frombuffer(raw, np.dtype(self.kind.dtype).newbyteorder("<"))


class _View:
    """A legacy storage view: ``size`` elements of ``root`` from ``offset``."""

    def __init__(self, root: _Storage, offset: int, size: int):
        self.root, self.offset, self.size = root, int(offset), int(size)
        if self.offset < 0 or self.size < 0 or self.offset + self.size > root.numel:
            raise WeightsError(f"a storage view of {self.size} elements from {self.offset} "
                               f"lies outside its storage of {root.numel}: the file is damaged",
                               "file")

    @property
    def data(self):
        return self.root.data[self.offset:self.offset + self.size]


class _Tensor:
    """A tensor to build once its storage's bytes are known."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.size, self.stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)

    def array(self) -> np.ndarray:
        flat = self.storage.data
        if (self.offset < 0 or len(self.size) != len(self.stride)
                or min(self.size + self.stride, default=0) < 0):
            raise WeightsError(f"a tensor of shape {self.size}, strides {self.stride} and "
                               f"offset {self.offset}: negative or mismatched, the file is "
                               "damaged", "file")
        if np.prod(self.size, dtype=object) > len(flat):
            raise WeightsError(f"a tensor of shape {self.size} holds more elements than its "
                               f"storage of {len(flat)}: not a state dict's tensor", "file")
        end = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1
        if 0 not in self.size and end > len(flat):
            raise WeightsError(f"a tensor of shape {self.size} reaches element {end} of a "
                               f"storage of {len(flat)}: the file is damaged", "file")
        view = np.lib.stride_tricks.as_strided(
            flat[self.offset:], shape=self.size,
            strides=tuple(s * flat.itemsize for s in self.stride))
        return np.array(view, dtype=flat.dtype.newbyteorder("="))


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored):
    # _rebuild_tensor (PyTorch 0.2/0.3) has four arguments; _rebuild_tensor_v2 adds
    # requires_grad, backward hooks and, since 1.12, metadata: none matter for weights.
    return _Tensor(storage, storage_offset, size, stride)


def _allowed(module: str, name: str):
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
        return _rebuild_tensor
    if module == "torch" and name in _STORAGE_DTYPES:
        return _StorageType(name)
    return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, path: Path, storages: dict, load_storage):
        super().__init__(file, encoding="utf-8")
        self.path, self.storages, self.load_storage = path, storages, load_storage

    def find_class(self, module, name):
        found = _allowed(module, name)
        if found is None:
            raise _NotAStateDict(f"{module}.{name}")
        return found

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or _text(pid[0]) != "storage":
            raise _NotAStateDict(f"a persistent object {pid!r:.60}")
        kind, key, numel = pid[1], _text(pid[2]), pid[4]
        if not isinstance(kind, _StorageType):
            raise _NotAStateDict(f"a storage of type {kind!r:.60}")
        if key not in self.storages:
            self.storages[key] = self.load_storage(key, kind, numel)
        storage = self.storages[key]
        view = pid[5] if len(pid) > 5 else None
        if view is not None:
            view_key, offset, size = view
            return self.storages.setdefault(_text(view_key), _View(storage, offset, size))
        return storage


class _DataUnpickler(pickle.Unpickler):
    """Plain data only (numbers, strings, lists, dicts): the legacy format's header pickles and
    its list of storage keys name no class and no persistent object."""

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="utf-8")
        self.path = path

    def find_class(self, module, name):
        raise WeightsError(
            f"{self.path}: a pickle outside its state dict names {module}.{name}, where a "
            "torch.save file holds plain data only: it is not a PyTorch weights file (or was "
            "made to run code when loaded); nothing in it was run.", "file")


class _NotAStateDict(Exception):
    """The pickle names something a state dict does not hold."""


def _text(value) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def is_torch_file(head: bytes) -> bool:
    """Whether a file beginning with ``head`` (≥ 4 bytes) may be a ``torch.save`` file: a zip
    (the zip format) or a pickle (the legacy format)."""
    return head.startswith((b"PK\x03\x04", b"\x80"))


def read_state_dict(path) -> dict[str, np.ndarray]:
    """The tensors of a ``torch.save``'d state dict, by name, as NumPy arrays.

    A dict holding the state dict under ``'state_dict'`` or ``'model'`` (a training
    checkpoint) gives that state dict.

    Raises:
        WeightsError: ``"file"``: not a ``torch.save`` file, truncated, or holding anything but
            tensors in (nested) dicts; the message names the file and what was found.
    """
    path = Path(path)
    try:
        result = _read(path)
    except _NotAStateDict as exc:
        result = _read_with_torch(path, f"it holds {exc}")
    except (MemoryError, RecursionError) as exc:
        raise WeightsError(
            f"{path} cannot be read as a PyTorch file: its pickle is nested too deeply or "
            f"declares more data than fits ({type(exc).__name__}); a state dict of weights does "
            "neither.", "file") from None
    except (pickle.UnpicklingError, EOFError, ValueError, struct.error, zipfile.BadZipFile,
            KeyError, IndexError, TypeError, AttributeError, OverflowError) as exc:
        raise WeightsError(
            f"{path} cannot be read as a PyTorch file ({type(exc).__name__}: {exc}): it is "
            f"truncated or damaged, or not a torch.save file. Download it again.",
            "file") from None
    return _tensors(result, path)


def _read(path: Path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        return _read_zip(path)
    if head.startswith(b"\x80"):
        return _read_legacy(path)
    raise WeightsError(f"{path} is not a PyTorch file: it is neither a zip archive nor a "
                       f"pickle (it begins with the bytes {head.hex(' ')}).", "file")


def _read_zip(path: Path):
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if names and all(n.endswith(".npy") for n in names):
            raise WeightsError(
                f"{path} is an .npz of NumPy arrays, not a PyTorch file (already in "
                f"ChainerCV's layout, e.g. converted before?).", "file")
        if len(pickles) != 1:
            raise WeightsError(
                f"{path} is a zip archive but not a torch.save file: it holds "
                f"{len(pickles)} data.pkl entries (a TorchScript archive or another tool's "
                f"zip?).", "file")
        prefix = pickles[0][:-len("data.pkl")]
        byteorder = archive.read(prefix + "byteorder").decode().strip() \
            if prefix + "byteorder" in names else "little"
        if byteorder != "little":
            raise WeightsError(f"{path} was saved on a {byteorder}-endian machine; "
                               f"medaidet reads little-endian files only.", "file")

        total = 0

        def load_storage(key, kind, numel):
            nonlocal total
            storage = _Storage(kind, numel)
            entry = archive.getinfo(f"{prefix}data/{key}")
            total += entry.file_size
            if entry.file_size != storage.numel * kind.itemsize or total > MAX_STATE_BYTES:
                raise WeightsError(
                    f"{path}: storage {key} is {entry.file_size} bytes in the archive, its "
                    f"header says {storage.numel} x {kind.itemsize} (all storages so far: "
                    f"{total}, at most {MAX_STATE_BYTES}): the file is damaged or not weights.",
                    "file")
            storage.set_bytes(archive.read(entry), path, key)
            return storage

        if archive.getinfo(pickles[0]).file_size > MAX_PICKLE_BYTES:
            raise WeightsError(f"{path}: its data.pkl declares more than {MAX_PICKLE_BYTES} "
                               "bytes, far more than a state dict's; not read.", "file")
        with archive.open(pickles[0]) as f:
            result = _Unpickler(io.BytesIO(f.read()), path, {}, load_storage).load()
        return _build(result)


def _read_legacy(path: Path):
    size = path.stat().st_size
    with open(path, "rb") as f:
        if _DataUnpickler(f, path).load() != MAGIC_NUMBER:
            raise WeightsError(f"{path} is a pickle but not a torch.save file (no PyTorch "
                               f"magic number at its start).", "file")
        version = _DataUnpickler(f, path).load()
        if version != PROTOCOL_VERSION:
            raise WeightsError(f"{path}: PyTorch file protocol {version!r}, expected "
                               f"{PROTOCOL_VERSION}.", "file")
        info = _DataUnpickler(f, path).load()
        if isinstance(info, dict) and info.get("little_endian") is False:
            raise WeightsError(f"{path} was saved on a big-endian machine; medaidet reads "
                               f"little-endian files only.", "file")
        storages: dict = {}
        result = _Unpickler(f, path, storages,
                            lambda key, kind, numel: _Storage(kind, numel)).load()
        for key in _DataUnpickler(f, path).load():
            storage = storages[_text(key)]
            (count,) = struct.unpack("<q", f.read(8))
            if count != storage.numel or count * storage.kind.itemsize > size - f.tell():
                raise WeightsError(f"{path}: storage {key} says {count} elements, its "
                                   f"tensors {storage.numel}, and {size - f.tell()} bytes "
                                   "are left in the file: the file is damaged.", "file")
            storage.set_bytes(f.read(count * storage.kind.itemsize), path, _text(key))
    return _build(result)


def _build(obj):
    """Replace every :class:`_Tensor` in nested dicts by its array."""
    if isinstance(obj, _Tensor):
        if obj.storage.data is None:
            raise WeightsError("a tensor's storage is missing from the file", "file")
        return obj.array()
    if isinstance(obj, dict):
        return {key: _build(value) for key, value in obj.items()}
    return obj


def _read_with_torch(path: Path, why: str):
    try:
        import torch
    except ImportError:
        raise WeightsError(
            f"{path} is not a plain PyTorch state dict that medaidet can read without "
            f"PyTorch ({why}). Install PyTorch (pip install torch) so that its safe loader "
            f"reads it, or use the same weights as a safetensors file.", "file") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types; name it, keep the cause
        raise WeightsError(f"PyTorch could not read {path} either ({type(exc).__name__}: "
                           f"{exc}).", "file") from exc
    return {key: value.float().numpy() if value.is_floating_point() else value.numpy()
            for key, value in _state_dict(state, path).items()}


def _state_dict(obj, path: Path) -> dict:
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict):
                return obj[key]
        return obj
    raise WeightsError(f"{path} holds a {type(obj).__name__}, not a state dict (a dict of "
                       f"tensors by name).", "file")


def _tensors(result, path: Path) -> dict[str, np.ndarray]:
    state = _state_dict(result, path)
    wrong = [key for key, value in state.items()
             if not isinstance(key, str) or not isinstance(value, np.ndarray)]
    if wrong:
        raise WeightsError(f"{path}: entry {wrong[0]!r} of its state dict is not a tensor "
                           f"({len(wrong)} such entries).", "file")
    return dict(state)
