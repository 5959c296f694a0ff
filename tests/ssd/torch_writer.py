"""A ``torch.save`` file written without PyTorch, for tests: a state dict of NumPy arrays in
PyTorch's zip format (``archive/data.pkl`` + ``archive/data/<key>``), its pickle written
opcode by opcode with the globals PyTorch writes (``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2``, ``torch.FloatStorage``, ...). Written this way because
PyTorch is not installed where the tests run; PyTorch 1.12 loads these files (checked when
this writer was written), and :mod:`medaidet.ssd.torch_files` is checked against files that
PyTorch itself saved (``data/torch_state_*.pth``).
"""
import struct
import zipfile

import numpy as np

STORAGES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
            np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage"}


def _global(module, name):
    return b"c" + f"{module}\n{name}\n".encode()


def _str(text):
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(n):
    return b"J" + struct.pack("<i", n)


def _tuple(items):
    return b"(" + b"".join(items) + b"t"


def _ordered_dict():
    return _global("collections", "OrderedDict") + b")R"


def write_pth(state: dict, path) -> None:
    """Write ``state`` ({name: array}) as ``torch.save(state_dict, path)`` would."""
    parts = [b"\x80\x02", _ordered_dict(), b"("]
    storages = []
    for key, array in state.items():
        array = np.array(array, order="C")   # (ascontiguousarray would make 0-d 1-d)
        storage_key = str(len(storages))
        storages.append((storage_key, array))
        pid = _tuple([_str("storage"), _global("torch", STORAGES[array.dtype]),
                      _str(storage_key), _str("cpu"), _int(array.size)])
        strides = [s // array.itemsize for s in array.strides]
        parts += [_str(key), _global("torch._utils", "_rebuild_tensor_v2"), b"(", pid, b"Q",
                  _int(0), _tuple([_int(n) for n in array.shape]),
                  _tuple([_int(s) for s in strides]), b"\x89", _ordered_dict(), b"tR"]
    parts += [b"u", b"."]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"".join(parts))
        archive.writestr("archive/byteorder", b"little")
        for storage_key, array in storages:
            archive.writestr(f"archive/data/{storage_key}",
                             array.astype(array.dtype.newbyteorder("<")).tobytes())
        archive.writestr("archive/version", b"3\n")
