"""The VGG-16 converter, proven on random weights against a NumPy reference of the unconverted
ones (not PyTorch: its Linux wheels' CUDA libraries exceed CI's install budget)."""
from pathlib import Path

import chainer
import numpy as np
import pytest
from chainercv.links import SSD300
from chainercv.transforms import resize
from chainercv.utils import read_image
from vgg_files import CONV_INDEX, WIDTHS, timm_layout, torchvision_vgg16, write_vgg_file

from medaidet.errors import WeightsError
from medaidet.ssd.weights import (SSD_MEAN, TORCHVISION_MEAN_255, convert_vgg16, read_vgg16,
                                  save_weights)

NAMES = ["conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv3_3",
         "conv4_1", "conv4_2", "conv4_3", "conv5_1", "conv5_2", "conv5_3"]
POOL_BEFORE = {"conv2_1", "conv3_1", "conv4_1", "conv5_1"}
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


@pytest.fixture(scope="module")
def vgg_state():
    return torchvision_vgg16(seed=0)


@pytest.fixture(scope="module")
def vgg_file(vgg_state, tmp_path_factory):
    """The weights as timm's safetensors file."""
    return write_vgg_file(vgg_state, tmp_path_factory.mktemp("vgg") / "model.safetensors")


def convert(source, out, mean=SSD_MEAN):
    """What pretrained_file does with timm's file: read, convert, write with a sidecar."""
    arrays = convert_vgg16(read_vgg16(source), mean=mean, path=source)
    return save_weights(arrays, out), len(arrays)


@pytest.fixture(scope="module")
def image(bccd_root):
    """A real BCCD image, resized to SSD300's input as ChainerCV does."""
    return resize(read_image(str(bccd_root / "JPEGImages" / "BloodImage_00000.jpg")),
                  (300, 300))


def conv3x3(x, weight, bias):
    """A 3×3 convolution, padding 1: the sum of nine shifted matrix products."""
    c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    out = np.repeat(bias[:, None].astype(np.float64), h * w, axis=1)
    for i in range(3):
        for j in range(3):
            out += weight[:, :, i, j].astype(np.float64) @ \
                padded[:, i:i + h, j:j + w].reshape(c, -1)
    return out.reshape(-1, h, w)


def pool_ceil(x):
    """2×2 max pooling, stride 2, the last window taken even when it is cut (ceil mode)."""
    c, h, w = x.shape
    padded = np.full((c, h + h % 2, w + w % 2), -np.inf)
    padded[:, :h, :w] = x
    return padded.reshape(c, padded.shape[1] // 2, 2, padded.shape[2] // 2, 2).max(axis=(2, 4))


def reference(state, image):
    """Every convolution's output (before its ReLU), unconverted weights, torchvision input."""
    x = (image.astype(np.float64) / 255 - MEAN[:, None, None]) / STD[:, None, None]
    outputs = {}
    for name, index in zip(NAMES, CONV_INDEX):
        if name in POOL_BEFORE:
            x = pool_ceil(x)
        outputs[name] = conv3x3(x, state[f"features.{index}.weight"],
                                state[f"features.{index}.bias"])
        x = np.maximum(outputs[name], 0)
    return outputs


class Outputs(chainer.LinkHook):
    """Records what each named link of ChainerCV's extractor returns."""

    name = "outputs"

    def __init__(self):
        self.by_link = {}

    def forward_postprocess(self, args):
        if args.link.name in NAMES:
            self.by_link[args.link.name] = args.out.array


def chainercv_outputs(npz, image, mean):
    model = SSD300(n_fg_class=3)
    chainer.serializers.load_npz(str(npz), model, strict=False)
    x = (image - np.asarray(mean, dtype=np.float32).reshape(3, 1, 1))[None]
    with chainer.using_config("train", False), Outputs() as hook:
        model.extractor(x)
    return {name: hook.by_link[name][0] for name in NAMES}, model


def relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.slow(seconds=4)
def test_converted_extractor_equals_the_reference_layer_by_layer(vgg_state, vgg_file, image,
                                                                  tmp_path):
    # the SSD subtracts torchvision's mean (x 255): the conversion is exact everywhere
    out = tmp_path / "vgg.npz"
    assert convert(vgg_file, out, mean=TORCHVISION_MEAN_255)[1] == 31
    ours, model = chainercv_outputs(out, image, TORCHVISION_MEAN_255)
    want = reference(vgg_state, image)
    assert ours["conv4_3"].shape == (512, 38, 38)          # ceil-mode pooling: 300 -> 38
    assert ours["conv5_3"].shape == want["conv5_3"].shape == (512, 19, 19)
    for name in NAMES:
        assert ours[name].shape == want[name].shape, name
        assert relative(ours[name], want[name]) <= 1e-4, (name, relative(ours[name],
                                                                          want[name]))
        assert np.abs(want[name]).max() > 0.1, name         # not a comparison of zeros
    np.testing.assert_array_equal(model.extractor.norm4.scale.array, np.full(512, 20))


@pytest.mark.slow(seconds=2)
def test_with_chainercvs_mean_only_the_padded_frame_of_conv1_1_differs(vgg_state, vgg_file,
                                                                        image, tmp_path):
    out = tmp_path / "vgg.npz"
    convert(vgg_file, out)                                         # ChainerCV's mean
    ours, _ = chainercv_outputs(out, image, SSD_MEAN)
    x = (image.astype(np.float64) / 255 - MEAN[:, None, None]) / STD[:, None, None]
    want = conv3x3(x, vgg_state["features.0.weight"], vgg_state["features.0.bias"])
    diff = ours["conv1_1"] - want
    scale = np.abs(want).max()
    assert np.abs(diff[:, 1:-1, 1:-1]).max() / scale <= 1e-5
    # on the frame, zero padding stands for SSD_MEAN here and 255 x torchvision's mean there
    shift = (SSD_MEAN - 255 * MEAN) / (255 * STD)
    weight = vgg_state["features.0.weight"].astype(np.float64)
    zero = np.zeros(64)
    inside = conv3x3(np.broadcast_to(shift[:, None, None], (3, 300, 300)), weight, zero)
    expected = np.einsum("ocij,c->o", weight, shift)[:, None, None] - inside
    assert np.abs(diff - expected).max() / scale <= 1e-5
    assert np.abs(expected[:, 0, :]).max() / scale > 1e-3    # the frame's term is real


def test_fc6_fc7_subsampling_element_by_element(vgg_state, tmp_path):
    arrays = convert_vgg16(timm_layout(vgg_state))
    fc6 = vgg_state["classifier.0.weight"]          # (4096, 25088): input c*49 + row*7 + col
    conv6 = arrays["extractor/conv6/W"]
    assert conv6.shape == (1024, 512, 3, 3)
    o, c, i, j = np.meshgrid(np.arange(1024), np.arange(512), np.arange(3), np.arange(3),
                             indexing="ij")
    np.testing.assert_array_equal(conv6, fc6[4 * o, c * 49 + (3 * i) * 7 + 3 * j])
    np.testing.assert_array_equal(arrays["extractor/conv6/b"],
                                  vgg_state["classifier.0.bias"][0:4096:4])
    fc7 = vgg_state["classifier.3.weight"]
    conv7 = arrays["extractor/conv7/W"]
    assert conv7.shape == (1024, 1024, 1, 1)
    o, c = np.meshgrid(np.arange(1024), np.arange(1024), indexing="ij")
    np.testing.assert_array_equal(conv7[:, :, 0, 0], fc7[4 * o, 4 * c])
    np.testing.assert_array_equal(arrays["extractor/conv7/b"],
                                  vgg_state["classifier.3.bias"][0:4096:4])
    for name, index in list(zip(NAMES, CONV_INDEX))[1:]:
        np.testing.assert_array_equal(arrays[f"extractor/{name}/W"],
                                      vgg_state[f"features.{index}.weight"])


def nan_at_0(state):
    state["features.12.weight"] = state["features.12.weight"].copy()
    state["features.12.weight"][0, 0, 0, 0] = np.nan


def with_batch_norm(state):
    """vgg16_bn's layout: conv, bn, relu."""
    conv = {index: state.pop(f"features.{index}.weight") for index in CONV_INDEX}
    state.clear()
    for position, index in enumerate(CONV_INDEX):
        state[f"features.{index + position}.weight"] = conv[index]
        state[f"features.{index + position + 1}.running_mean"] = np.zeros(WIDTHS[position],
                                                                          np.float32)


@pytest.mark.parametrize("change, fields", [
    (lambda s: s.pop("features.10.weight"),
     dict(kind="mismatch", parameter="features.10.weight", expected=(256, 128, 3, 3), found=None)),
    (lambda s: s.update({"pre_logits.fc1.weight": np.zeros((4096, 256, 6, 6), np.float32)}),
     dict(kind="mismatch", parameter="pre_logits.fc1.weight", expected=(4096, 512, 7, 7),
          found=(4096, 256, 6, 6))),
    (nan_at_0, dict(kind="not_finite", parameter="features.12.weight", count=1)),
    (with_batch_norm, dict(kind="mismatch", parameter="features.0.bias")),
    (lambda s: [s.pop(k) for k in list(s) if k.startswith("features.")],
     dict(kind="mismatch", parameter="features.0.weight")),
], ids=["missing", "shape", "nan", "vgg16_bn", "classifier-only"])
def test_a_wrong_array_is_named(vgg_state, change, fields):
    state = timm_layout(vgg_state)
    change(state)
    with pytest.raises(WeightsError) as info:
        convert_vgg16(state, path="v.safetensors")
    assert {name: getattr(info.value, name) for name in ("path", *fields)} == \
        dict(path=Path("v.safetensors"), **fields)


@pytest.mark.parametrize("name, data", [
    ("model.safetensors", "half of it"), ("empty.pth", b""), ("jpeg", None),
    ("vgg16.pth", b"\x80\x02" + b"c__builtin__\nprint\n" * 4),    # as torch.save may write
], ids=["truncated", "empty", "jpeg", "pickle"])
def test_other_files_are_named(vgg_file, tmp_path, bccd_root, name, data):
    """A pickle is never read, however it is named."""
    path = bccd_root / "JPEGImages" / "BloodImage_00000.jpg" if data is None else tmp_path / name
    if isinstance(data, str):            # half of timm's file
        data = vgg_file.read_bytes()[:vgg_file.stat().st_size // 2]
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(WeightsError) as info:
        read_vgg16(path)
    assert (info.value.kind, info.value.path) == ("file", path)
