"""ChainerCV's two OpenCV-backed augmentation steps, for when OpenCV is not installed.

OpenCV is optional in this course. Without it (:data:`IMAGE_BACKEND` ``"numpy+PIL"``),
:mod:`medaidet.ssd.transforms` uses these ports of ``random_distort`` and
``resize_with_random_interpolation``, which draw the same random numbers in the same order
(NumPy colour changes in OpenCV's 8-bit HSV, a PIL resize with the corresponding filter).
"""
from __future__ import annotations

import random

import numpy as np
from PIL import Image

__all__ = ["IMAGE_BACKEND", "random_distort", "resize_with_random_interpolation",
           "rgb_to_hsv_u8", "hsv_to_rgb_u8"]

try:
    import cv2  # noqa: F401  (only whether it imports matters)
    from chainercv.links.model.ssd import random_distort, resize_with_random_interpolation
    IMAGE_BACKEND = "cv2"
except ImportError:
    IMAGE_BACKEND = "numpy+PIL"


def rgb_to_hsv_u8(rgb):
    """uint8 (3, H, W) RGB -> uint8 (3, H, W) HSV in OpenCV's 8-bit convention (H 0-179,
    S and V 0-255), as ``cv2.cvtColor(hwc, cv2.COLOR_RGB2HSV)`` up to rounding."""
    r, g, b = rgb.astype(np.float32)
    v = np.maximum(np.maximum(r, g), b)
    diff = v - np.minimum(np.minimum(r, g), b)
    s = np.divide(255 * diff, v, out=np.zeros_like(v), where=v > 0)
    red_max, green_max = v == r, v == g
    # hue sextant by the maximum channel, checked red, green, blue as OpenCV does
    h = np.where(red_max, g - b, np.where(green_max, b - r, r - g))
    np.divide(h, diff, out=h, where=diff > 0)
    h += np.where(red_max, np.float32(0), np.where(green_max, np.float32(2), np.float32(4)))
    h *= 30
    h[diff == 0] = 0
    h[h < 0] += 180
    out = np.empty(rgb.shape, dtype=np.uint8)
    out[0] = np.rint(h) % 180
    out[1] = np.rint(s)
    out[2] = v
    return out


def hsv_to_rgb_u8(hsv):
    """uint8 (3, H, W) HSV in OpenCV's 8-bit convention -> uint8 (3, H, W) RGB, as
    ``cv2.cvtColor(hwc, cv2.COLOR_HSV2RGB)`` up to rounding."""
    h, s, v = hsv.astype(np.float32)
    h /= 30                         # sextant position, 0 to 6
    vs = v * s
    vs /= 255
    out = np.empty(hsv.shape, dtype=np.uint8)
    for channel, n in enumerate((5, 3, 1)):          # R, G, B
        k = h + n
        np.subtract(k, 6, out=k, where=k >= 6)       # (n + h) mod 6
        weight = np.minimum(k, 4 - k)
        np.clip(weight, 0, 1, out=weight)
        weight *= vs
        out[channel] = np.rint(v - weight)
    return out


def _random_distort_numpy(img, brightness_delta=32, contrast_low=0.5, contrast_high=1.5,
                          saturation_low=0.5, saturation_high=1.5, hue_delta=18):
    """ChainerCV's ``random_distort`` without OpenCV: the same steps, in the same order,
    drawing the same random numbers. img: (3, H, W) RGB 0-255 -> float32 (3, H, W)."""
    chw = img.astype(np.uint8)

    def convert(x, alpha=1, beta=0):      # in float64, as ChainerCV's: the same truncation
        x = x.astype(float) * alpha + beta
        return np.clip(x, 0, 255).astype(np.uint8)

    def brightness(x):
        return convert(x, beta=random.uniform(-brightness_delta, brightness_delta)) \
            if random.randrange(2) else x

    def contrast(x):
        return convert(x, alpha=random.uniform(contrast_low, contrast_high)) \
            if random.randrange(2) else x

    def saturation(x):
        if not random.randrange(2):
            return x
        hsv = rgb_to_hsv_u8(x)
        hsv[1] = convert(hsv[1], alpha=random.uniform(saturation_low, saturation_high))
        return hsv_to_rgb_u8(hsv)

    def hue(x):
        if not random.randrange(2):
            return x
        hsv = rgb_to_hsv_u8(x)
        hsv[0] = (hsv[0].astype(np.int16) + random.randint(-hue_delta, hue_delta)) % 180
        return hsv_to_rgb_u8(hsv)

    chw = brightness(chw)
    if random.randrange(2):
        chw = hue(saturation(contrast(chw)))
    else:
        chw = contrast(hue(saturation(chw)))
    return chw.astype(np.float32)


# PIL's match for each of INTER_LINEAR, INTER_AREA, INTER_NEAREST, INTER_CUBIC, INTER_LANCZOS4
_PIL_FILTERS = (Image.BILINEAR, Image.BOX, Image.NEAREST, Image.BICUBIC, Image.LANCZOS)


def _resize_with_random_interpolation_pil(img, size):
    """ChainerCV's ``resize_with_random_interpolation`` without OpenCV (PIL, one of five
    filters chosen by the same draw). img float32 (C, H, W); size (H, W)."""
    resample = random.choice(_PIL_FILTERS)
    height, width = size
    return np.stack([
        np.asarray(Image.fromarray(np.ascontiguousarray(channel, dtype=np.float32))
                   .resize((width, height), resample=resample))
        for channel in img]).astype(np.float32, copy=False)


if IMAGE_BACKEND != "cv2":
    random_distort = _random_distort_numpy
    resize_with_random_interpolation = _resize_with_random_interpolation_pil
