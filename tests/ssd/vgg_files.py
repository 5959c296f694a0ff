"""VGG-16 weight files made for tests: random weights in torchvision's and timm's layouts."""
import math

import numpy as np


# torchvision's vgg16(): where each 3×3 convolution sits in `features`, and its width
CONV_INDEX = [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
WIDTHS = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]


def torchvision_vgg16(seed):
    """Random torchvision vgg16 weights (He-scaled to keep activations' size; biases non-zero)."""
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


def write_vgg_file(state, path):
    """``state`` as timm's safetensors file at ``path``."""
    from safetensors.numpy import save_file
    save_file(timm_layout(state), str(path))
    return path
