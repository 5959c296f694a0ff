"""ImageNet VGG-16 weights published for PyTorch, converted for ChainerCV's SSD.

SSD300 and SSD512 start from an ImageNet VGG-16 (:class:`chainercv.links.model.ssd.VGG16`):
thirteen 3×3 convolutions, then ``conv6``/``conv7``, the "reduced" fully connected layers of
the SSD paper. timm publishes torchvision's ImageNet weights of that network as a safetensors
file (``vgg16.tv_in1k``: no pickle, read by the ``safetensors`` library; its ``features.*`` are
torchvision's names). This module reads it (:func:`read_vgg16`) and converts it
(:func:`convert_vgg16`; a torchvision-layout state dict converts the same way):

* **conv1_1 … conv5_3** are copied. torchvision's network sees RGB in [0, 1], normalised
  per channel, ``(pixel / 255 - MEAN) / STD``; ChainerCV's SSD sees RGB pixels minus its own
  ``mean``, ``pixel - mean``. So ``(pixel / 255 - MEAN) / STD = x / (255 STD) + (mean - 255
  MEAN) / (255 STD)`` with ``x = pixel - mean``: conv1_1's weights are divided by ``255 STD``
  (the scale) and the shift times the weights is added to its bias. The scale is exact
  everywhere. The shift is exact wherever conv1_1's 3×3 window lies inside the image; on the
  image's one-pixel frame the window also covers zero padding, which stands for the pixel
  ``mean`` in ChainerCV and ``255 MEAN`` in torchvision: ChainerCV's SSD mean (123, 117, 104)
  and torchvision's ×255 (123.675, 116.28, 103.53) differ by under one grey level. With
  ``mean=TORCHVISION_MEAN_255`` there is no shift and the conversion is exact everywhere.
  (ChainerCV's own ImageNet file, converted from Caffe, which used the mean (123.68, 116.78,
  103.94), is off by the same amount on every pixel.)
* **conv6 and conv7** are ``fc6`` and ``fc7`` subsampled as the SSD paper describes ("we
  convert fc6 and fc7 to convolutional layers, subsample parameters from fc6 and fc7"), by
  decimation: ``fc6``'s weight (4096 × 25088) seen as 4096 × 512 × 7 × 7 keeps every 4th
  output unit (0, 4, …, 4092) and every 3rd kernel row and column (0, 3, 6), a 1024 × 512 ×
  3 × 3 kernel that ChainerCV's ``conv6`` dilates by 6 to cover the original 7×7 (pool5
  being 3×3 with stride 1, a 13-pixel span); ``fc7``'s weight keeps every 4th output and
  every 4th input unit, a 1×1 convolution 1024 × 1024; the biases keep every 4th entry.
  The SSD authors' own Caffe file was made by such a decimation, but its indices were
  never published: ChainerCV's server file need not equal this conversion elementwise.
* **norm4** (conv4_3's L2 normalisation, not in VGG-16) gets ChainerCV's initial scale, 20.

The result's names are those of ChainerCV's ImageNet file (``extractor/conv1_1/W`` …
``extractor/conv7/b``) plus ``extractor/norm4/scale``: ``chainer.serializers.load_npz(path,
ssd, strict=False)`` loads it into SSD300 or SSD512.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from medaidet.errors import WeightsError

__all__ = [
    "CONVS", "CHAINERCV_SHAPES", "TORCHVISION_MEAN", "TORCHVISION_STD", "TORCHVISION_MEAN_255", "SSD_MEAN",
    "NORM4_SCALE", "VGG16_SHAPES", "read_vgg16", "convert_vgg16", "decimate_fc6", "decimate_fc7",
]

#: ChainerCV's names of the thirteen convolutions, in order, and where each sits in
#: torchvision's (and timm's) ``features`` Sequential (ReLUs and pools in between).
CONVS = ("conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv3_3",
         "conv4_1", "conv4_2", "conv4_3", "conv5_1", "conv5_2", "conv5_3")
FEATURE_INDEX = dict(zip(CONVS, (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)))
_WIDTHS = (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)

#: torchvision's ImageNet normalisation (RGB, for pixels scaled to [0, 1]).
TORCHVISION_MEAN = np.array([0.485, 0.456, 0.406])
TORCHVISION_STD = np.array([0.229, 0.224, 0.225])
#: The same mean in pixel units: a ChainerCV SSD with this ``mean`` gets an exact conversion.
TORCHVISION_MEAN_255 = TORCHVISION_MEAN * 255
#: ChainerCV's SSD300/SSD512 ``mean`` (RGB).
SSD_MEAN = np.array([123.0, 117.0, 104.0])
#: ChainerCV's initial conv4_3 normalisation scale (``VGG16.norm4``).
NORM4_SCALE = 20.0

#: The convolutions' shapes, in the names of the file they come from (torchvision's
#: ``VGG16_SHAPES``) and of ChainerCV's ImageNet file (``CHAINERCV_SHAPES``: ChainerCV's
#: server file; the converter's output adds ``extractor/norm4/scale``).
VGG16_SHAPES, CHAINERCV_SHAPES = {}, {}
for _name, _width, _in in zip(CONVS, _WIDTHS, (3, *_WIDTHS[:-1])):
    VGG16_SHAPES[f"features.{FEATURE_INDEX[_name]}.weight"] = (_width, _in, 3, 3)
    VGG16_SHAPES[f"features.{FEATURE_INDEX[_name]}.bias"] = (_width,)
    CHAINERCV_SHAPES[f"extractor/{_name}/W"] = (_width, _in, 3, 3)
    CHAINERCV_SHAPES[f"extractor/{_name}/b"] = (_width,)
del _name, _width, _in
CHAINERCV_SHAPES.update({"extractor/conv6/W": (1024, 512, 3, 3), "extractor/conv6/b": (1024,),
                         "extractor/conv7/W": (1024, 1024, 1, 1), "extractor/conv7/b": (1024,)})
#: fc6 and fc7 in each publisher's layout: torchvision's Linear layers, timm's 7×7 and 1×1
#: convolutions (``pre_logits``); the ImageNet classifier (``classifier.6``/``head.fc``)
#: is not used.
FC_LAYOUTS = {
    "torchvision": {"fc6": ("classifier.0", (4096, 25088)), "fc7": ("classifier.3", (4096, 4096))},
    "timm": {"fc6": ("pre_logits.fc1", (4096, 512, 7, 7)),
             "fc7": ("pre_logits.fc2", (4096, 4096, 1, 1))},
}


# --------------------------------------------------------------------------- reading

def read_vgg16(path) -> dict[str, np.ndarray]:
    """The arrays of timm's VGG-16 safetensors file (``torch.save``'s ``.pth``, a pickle, is
    not read).

    Raises:
        WeightsError: ``"file"``: empty, truncated, damaged or another kind of file (says which).
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"no VGG-16 weight file at {path}", "missing", path=path)
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        raise WeightsError(f"{path} is empty (0 bytes): the download or copy did not "
                           f"finish; get it again.", "file", path=path)
    if not _is_safetensors(head):
        torch = head.startswith((b"PK", b"\x80"))     # torch.save's zip, or its pickle
        raise WeightsError(
            f"{path} is not a safetensors file (it begins with the bytes {head[:8].hex(' ')}"
            f"{': torch.save wrote it?' if torch else ''}): use timm's vgg16.tv_in1k "
            f"model.safetensors.", "file", path=path)
    return _read_safetensors(path)


def _is_safetensors(head: bytes) -> bool:
    # an 8-byte little-endian header length, then the JSON header
    return len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(
            f"{path} cannot be read as a safetensors file ({exc}): it is truncated or "
            f"damaged; download it again.", "file", path=path) from None


# --------------------------------------------------------------------------- converting

def decimate_fc6(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fc6 (4096 outputs over 512 × 7 × 7, as a Linear (4096, 25088) or a 7×7 convolution)
    → conv6: every 4th output unit, kernel rows and columns 0, 3 and 6."""
    weight = np.asarray(weight).reshape(4096, 512, 7, 7)
    return weight[::4, :, ::3, ::3], np.asarray(bias)[::4]


def decimate_fc7(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fc7 (4096 × 4096, as a Linear or a 1×1 convolution) → conv7: every 4th output and
    every 4th input unit, as a 1×1 convolution."""
    weight = np.asarray(weight).reshape(4096, 4096)
    return weight[::4, ::4].reshape(1024, 1024, 1, 1), np.asarray(bias)[::4]


def _check_used(state: dict, used: dict, path: Path) -> None:
    """Every array the conversion uses is in ``state`` with its shape (``used``: name ->
    shape), and finite; a ``"mismatch"`` or ``"not_finite"`` WeightsError otherwise."""
    for key, shape in used.items():
        if key not in state:
            raise _layout_error(state, path, key, shape, None)
        if tuple(np.shape(state[key])) != shape:
            raise _layout_error(state, path, key, shape, tuple(np.shape(state[key])))
    bad = [key for key in used if not np.isfinite(state[key]).all()]
    if bad:
        values = np.asarray(state[bad[0]])
        raise WeightsError(
            f"{path}: {bad[0]} holds {int(np.isnan(values).sum())} NaN and "
            f"{int(np.isinf(values).sum())} infinite of its {values.size} values ({len(bad)} "
            f"of the {len(used)} arrays used hold some). A download does not do this: the "
            f"file was damaged or written by a diverged training; use the published file.",
            "not_finite",
            path=path, parameter=bad[0], count=len(bad))


def convert_vgg16(state: dict, mean=SSD_MEAN, path: Path | str = "the weights"
                  ) -> tuple[dict[str, np.ndarray], str]:
    """ChainerCV's VGG16 parameters from a torchvision- or timm-layout state dict.

    Args:
        state: the file's arrays by name (``read_vgg16``); a ``module.`` prefix (a model
            saved from ``DataParallel``) is removed.
        mean: the RGB mean the receiving SSD subtracts (``model.mean``); the default is
            ChainerCV's. See the module docstring for why conv1_1's bias depends on it.
        path: the file, named in errors.

    Returns:
        ``({'extractor/conv1_1/W': ..., ...}, layout)`` with float32 arrays; ``layout`` is
        ``'torchvision'`` or ``'timm'``.

    Raises:
        WeightsError: ``"mismatch"``: an entry is missing or has another shape (names it,
            and what the file looks like instead: VGG-16 with batch norm, a classifier
            only, ...).
        WeightsError: ``"not_finite"``: NaN or infinite values in an entry that is used.
    """
    path = Path(str(path))
    state = {re.sub(r"^module\.", "", key): value for key, value in state.items()}
    layout = "timm" if "pre_logits.fc1.weight" in state else "torchvision"
    used = dict(VGG16_SHAPES)
    for name, shape in FC_LAYOUTS[layout].values():
        used[f"{name}.weight"], used[f"{name}.bias"] = shape, shape[:1]
    _check_used(state, used, path)

    out = {}
    for name in CONVS:
        index = FEATURE_INDEX[name]
        out[f"extractor/{name}/W"] = state[f"features.{index}.weight"]
        out[f"extractor/{name}/b"] = state[f"features.{index}.bias"]
    # conv1_1: fold the input normalisation in, in float64
    weight = np.asarray(out["extractor/conv1_1/W"], dtype=np.float64)
    bias = np.asarray(out["extractor/conv1_1/b"], dtype=np.float64)
    scale = 1.0 / (255.0 * TORCHVISION_STD)                      # per input channel
    shift = (np.asarray(mean, dtype=np.float64).reshape(3) - TORCHVISION_MEAN_255) * scale
    out["extractor/conv1_1/W"] = weight * scale[None, :, None, None]
    out["extractor/conv1_1/b"] = bias + np.einsum("ocij,c->o", weight, shift)
    fc6, fc7 = FC_LAYOUTS[layout]["fc6"][0], FC_LAYOUTS[layout]["fc7"][0]
    out["extractor/conv6/W"], out["extractor/conv6/b"] = decimate_fc6(
        state[f"{fc6}.weight"], state[f"{fc6}.bias"])
    out["extractor/conv7/W"], out["extractor/conv7/b"] = decimate_fc7(
        state[f"{fc7}.weight"], state[f"{fc7}.bias"])
    out["extractor/norm4/scale"] = np.full(512, NORM4_SCALE)
    return {key: np.ascontiguousarray(value, dtype=np.float32)
            for key, value in sorted(out.items())}, layout


def _layout_error(state, path, key, expected, found) -> WeightsError:
    keys = sorted(state)
    features = [k for k in keys if k.startswith("features.")]
    if found is None:
        what = f"{key} (shape {expected}) is not in the file"
    else:
        what = f"{key} has shape {found} in the file, VGG-16 has {expected}"
    if not features and any(k.startswith(("classifier.", "head.", "pre_logits.")) for k in keys):
        cause = ("the file holds only the classifier (no features.* convolutions): it was "
                 "cut from a whole model; use the complete published file.")
    elif any(k.endswith("running_mean") for k in features):
        cause = ("the file is VGG-16 with batch normalisation (vgg16_bn: batch-norm layers "
                 "shift the convolutions' indices); SSD's VGG16 has none: use vgg16, not "
                 "vgg16_bn.")
    elif not features:
        cause = (f"the file holds no VGG network (its first names: "
                 f"{', '.join(keys[:4]) or 'none'}): use timm's vgg16.tv_in1k "
                 f"model.safetensors.")
    elif len([k for k in features if k.endswith(".weight")]) != 13:
        n = len([k for k in features if k.endswith(".weight")])
        cause = (f"the file has {n} convolution{'' if n == 1 else 's'}, VGG-16 has 13 (VGG-11, -13 or "
                 f"-19?): use "
                 f"VGG-16's weights.")
    else:
        cause = "the file was saved from a modified VGG-16; use the published file."
    return WeightsError(f"{path} is not torchvision's or timm's ImageNet VGG-16: {what}. "
                        f"Likely cause: {cause}",
                        "mismatch", path=path, parameter=key, expected=expected, found=found)
