"""VGG-16 weight files made for tests: random weights with torchvision's names and shapes
(:func:`torchvision_vgg16`), timm's layout of them (:func:`timm_layout`), and

a ``torch.save`` file written without PyTorch (:func:`write_pth`): a state dict of NumPy arrays in
PyTorch's zip format (``archive/data.pkl`` + ``archive/data/<key>``), its pickle written
opcode by opcode with the globals PyTorch writes (``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2``, ``torch.FloatStorage``, ...). Written this way because
PyTorch is not installed where the tests run; PyTorch 1.12 loads these files (checked when
this writer was written), and :mod:`medaidet.ssd.torch_files` is checked against files that
PyTorch itself saved (``data/torch_state_*.pth``).
"""
import math
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


# torchvision's vgg16(): where each 3×3 convolution sits in `features`, and its width
CONV_INDEX = [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
WIDTHS = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]


def torchvision_vgg16(seed):
    """Random weights with torchvision vgg16's names and shapes (He-scaled, so activations
    keep their size through thirteen layers; biases non-zero, so they matter)."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        return (rng.standard_normal(shape, dtype=np.float32)
                * np.float32(math.sqrt(2 / math.prod(shape[1:]))))

    state, width_in = {}, 3
    for index, width in zip(CONV_INDEX, WIDTHS):
        state[f"features.{index}.weight"] = he(width, width_in, 3, 3)
        state[f"features.{index}.bias"] = rng.standard_normal(width, dtype=np.float32) * 0.1
        width_in = width
    for index, shape in ((0, (4096, 25088)), (3, (4096, 4096)), (6, (1000, 4096))):
        state[f"classifier.{index}.weight"] = he(*shape)
        state[f"classifier.{index}.bias"] = rng.standard_normal(shape[0], dtype=np.float32)
    return state


def timm_layout(state):
    """The same weights as timm's vgg16.tv_in1k holds them: fc6/fc7 as convolutions."""
    out = {k: v for k, v in state.items() if k.startswith("features.")}
    out["pre_logits.fc1.weight"] = state["classifier.0.weight"].reshape(4096, 512, 7, 7)
    out["pre_logits.fc1.bias"] = state["classifier.0.bias"]
    out["pre_logits.fc2.weight"] = state["classifier.3.weight"].reshape(4096, 4096, 1, 1)
    out["pre_logits.fc2.bias"] = state["classifier.3.bias"]
    out["head.fc.weight"] = state["classifier.6.weight"]
    out["head.fc.bias"] = state["classifier.6.bias"]
    return out


def write_vgg_files(state, folder, pth="vgg16.pth", safetensors="model.safetensors") -> dict:
    """``state`` as torchvision's ``.pth`` and as timm's safetensors file in ``folder``."""
    from safetensors.numpy import save_file
    write_pth(state, folder / pth)
    save_file(timm_layout(state), str(folder / safetensors))
    return {"torchvision": folder / pth, "timm": folder / safetensors}
