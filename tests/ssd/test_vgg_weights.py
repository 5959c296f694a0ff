"""The VGG-16 converter, proven on random weights against a NumPy reference of the unconverted
ones (not PyTorch: its Linux wheels' CUDA libraries exceed CI's install budget)."""
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


@pytest.mark.parametrize("key, value, fields", [
    ("features.10.weight", None,
     dict(kind="mismatch", expected=(256, 128, 3, 3), found=None)),
    ("pre_logits.fc1.weight", np.zeros((4096, 256, 6, 6), np.float32),
     dict(kind="mismatch", expected=(4096, 512, 7, 7), found=(4096, 256, 6, 6))),
    ("features.12.weight", "nan", dict(kind="not_finite", count=1)),
], ids=["missing", "shape", "nan"])
def test_a_wrong_array_is_named(vgg_state, key, value, fields):
    state = timm_layout(vgg_state)
    if value is None:
        del state[key]
    elif isinstance(value, str):
        state[key] = state[key].copy()
        state[key][0, 0, 0, 0] = np.nan
    else:
        state[key] = value
    with pytest.raises(WeightsError) as info:
        convert_vgg16(state, path="v.safetensors")
    assert info.value.parameter == key
    assert {name: getattr(info.value, name) for name in fields} == fields


def test_vgg16_with_batch_norm_is_named(vgg_state):
    state = {}
    for position, index in enumerate(CONV_INDEX):        # vgg16_bn: conv, bn, relu
        bn_index = index + position + 1
        state[f"features.{index + position}.weight"] = vgg_state[f"features.{index}.weight"]
        state[f"features.{bn_index}.running_mean"] = np.zeros(WIDTHS[position], np.float32)
    with pytest.raises(WeightsError) as info:
        convert_vgg16(state)
    assert info.value.kind == "mismatch" and "vgg16_bn" in str(info.value)
    assert info.value.parameter == "features.0.bias"


def test_classifier_only_is_named(vgg_state):
    state = {k: v for k, v in timm_layout(vgg_state).items()
             if k.startswith(("pre_logits.", "head."))}
    with pytest.raises(WeightsError) as info:
        convert_vgg16(state, path="head.safetensors")
    assert info.value.kind == "mismatch" and info.value.path.name == "head.safetensors"
    assert info.value.parameter == "features.0.weight"


def test_truncated_file_is_named(vgg_file, tmp_path):
    cut = tmp_path / vgg_file.name
    cut.write_bytes(vgg_file.read_bytes()[:vgg_file.stat().st_size // 2])
    with pytest.raises(WeightsError) as info:
        read_vgg16(cut)
    assert (info.value.kind, info.value.path) == ("file", cut)


def test_other_files_are_named(tmp_path, bccd_root):
    """A pickle (as torch.save may write) is never read, however it is named."""
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    jpeg = bccd_root / "JPEGImages" / "BloodImage_00000.jpg"
    pth = tmp_path / "vgg16.pth"
    pth.write_bytes(b"\x80\x02" + b"c__builtin__\nprint\n" * 4)
    for path in (empty, jpeg, pth):
        with pytest.raises(WeightsError) as info:
            read_vgg16(path)
        assert (info.value.kind, info.value.path) == ("file", path)
