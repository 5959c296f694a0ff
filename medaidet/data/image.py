"""Decoding an image as the loader uses it (8-bit RGB): the one rule of what is readable, for
the loader, the validator, ``medaidet count-image`` and :func:`medaidet.extras.deploy.read_rgb`
(so Pillow and NumPy only, no chainer). Other 8-bit modes are converted to RGB; 16-bit grayscale
scaled (``value / 257``, not clipped); alpha dropped when every pixel is opaque. A truncated
file, transparent pixels, another pixel format or a decompression bomb raise an ``"image"``
DataError; a missing file ``"missing_file"``."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from medaidet.errors import DataError, MedaidetError
from medaidet.files import not_a_regular_file

__all__ = ["read_image_size", "decode_image", "DecodedImage"]


def _open_image(path, image_id, read):
    """``read(img)`` of the opened image at ``path``; every failure a named DataError."""
    if why := not_a_regular_file(path := Path(path)):
        raise DataError(f"{path} is {why}, not an image file; give the path of a JPEG or PNG "
                        "file", "image", path=path, image_id=image_id)
    try:
        with Image.open(path) as img:
            return read(img)
    except FileNotFoundError:
        raise DataError(f"image file {path} does not exist", "missing_file", path=path,
                        image_id=image_id) from None
    except MedaidetError:
        raise
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path} is too large to decode safely ({exc}); downscale it first",
                        "image", path=path, image_id=image_id) from None
    except Exception as exc:     # PIL: OSError (truncated), SyntaxError, ValueError, ...
        raise DataError(f"{path} cannot be decoded ({type(exc).__name__}: {exc}); "
                        "restore it from the original dataset", "image", path=path,
                        image_id=image_id) from None


def read_image_size(path, image_id=None) -> tuple[int, int]:
    """(height, width) from the image header (no decoding). Raises a ``"missing_file"`` or
    an ``"image"`` DataError."""
    return _open_image(path, image_id, lambda img: img.size[::-1])


class DecodedImage(NamedTuple):
    """An image as the loader uses it. pixels: uint8 (H, W, 3), RGB; mode, bands: the file's
    PIL mode and channels; conversion: a sentence on what was converted, None if nothing."""
    pixels: np.ndarray
    mode: str
    bands: int
    conversion: str | None


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _to_rgb(img: Image.Image, path: Path, image_id) -> tuple[np.ndarray, str | None]:
    """The loaded ``img`` as uint8 (H, W, 3) RGB, and the conversion made (or None)."""
    if (mode := img.mode) == "RGB":
        return np.asarray(img), None
    if mode in _SIXTEEN_BIT:
        low, high = (int(v) for v in img.getextrema())
        if low < 0 or high > 65535:
            raise DataError(f"{path} is a {mode} image with values {low}..{high}, beyond 16 bits; "
                            "save it as an 8-bit RGB JPEG", "image", path=path, image_id=image_id)
        gray = ((np.asarray(img).astype(np.uint32) + 128) // 257).astype(np.uint8)  # 65535: 255
        return (np.repeat(gray[:, :, None], 3, axis=2),
                f"{path} is 16-bit grayscale ({mode}): scaled to 8 bits (value / 257) and "
                "repeated in R, G and B")
    if img.has_transparency_data:
        rgba = img.convert("RGBA")
        if transparent := int(np.count_nonzero(np.asarray(rgba.getchannel("A")) < 255)):
            raise DataError(f"{path} has {transparent} transparent pixel(s) (mode {mode}); flatten "
                            "it onto its background and save it as an RGB JPEG", "image",
                            path=path, image_id=image_id)
        return (np.asarray(rgba.convert("RGB")),
                f"{path} is {mode} with every pixel opaque: alpha channel dropped")
    if mode in ("L", "P", "1", "CMYK", "YCbCr", "LAB", "HSV"):
        return (np.asarray(img.convert("RGB")),
                f"{path} is {mode} (not RGB): converted to 8-bit RGB"
                + (" (the gray value in R, G and B)" if mode in ("L", "1") else ""))
    raise DataError(f"{path} has the pixel format {mode} (32-bit or floating-point data?); "
                    "save it as an 8-bit RGB JPEG", "image", path=path, image_id=image_id)


def decode_image(path, image_id=None, draft_size=None) -> DecodedImage:
    """Decode an image by the rule above. ``draft_size`` (width, height): a JPEG is decoded at
    the smallest scale not below it; other formats in full."""
    def read(img):
        if draft_size is not None:
            img.draft("RGB", draft_size)
        img.load()
        pixels, conversion = _to_rgb(img, Path(path), image_id)
        return DecodedImage(pixels, img.mode, len(img.getbands()), conversion)
    return _open_image(path, image_id, read)
