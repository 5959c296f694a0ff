"""Detections from an exported model with onnxruntime, NumPy and Pillow (or OpenCV) only.

``OnnxDetector(path).predict(images)`` returns what ChainerCV's ``model.predict`` returns for
the same images (tests/deploy checks it on the test split): the image is resized to the
model's input size as ChainerCV resizes it (OpenCV when it is installed, else Pillow), the
graph gives ``locs`` and ``scores``, and :func:`medaidet.deploy.decode.decode` turns them
into boxes in the image's pixels with the preset's thresholds and the caps.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from medaidet.deploy.decode import decode, resize_boxes
from medaidet.errors import MedaidetError
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH

__all__ = ["OnnxDetector", "ModelFileError", "METADATA_KEY", "read_rgb", "resize_image"]

METADATA_KEY = "medaidet"      # the model's metadata entry written by medaidet export


class ModelFileError(MedaidetError):
    """The file is not an ONNX model written by ``medaidet export`` (or is not there)."""


def read_rgb(path) -> np.ndarray:
    """The image file at ``path`` as float32 (3, H, W), RGB, 0-255, read by the dataset
    loader's rule (:func:`medaidet.data.image.decode_image`: 16-bit grayscale scaled to 8
    bits, an opaque alpha channel dropped; transparent pixels, unreadable data and images too
    large to decode safely raise :class:`~medaidet.data.image.ImageError`)."""
    from medaidet.data.image import decode_image

    return decode_image(path).pixels.astype(np.float32).transpose(2, 0, 1)


def resize_image(image, size: int) -> np.ndarray:
    """``image`` (3, H, W) float32 resized to (3, size, size), bilinear: OpenCV when it is
    installed, else Pillow, as ChainerCV's ``transforms.resize`` chooses."""
    try:
        import cv2
    except ImportError:
        from PIL import Image

        out = np.empty((image.shape[0], size, size), dtype=np.float32)
        for channel, resized in zip(image, out):
            resized[:] = Image.fromarray(channel, mode="F").resize((size, size),
                                                                   resample=Image.BILINEAR)
        return out
    resized = cv2.resize(image.transpose(1, 2, 0), dsize=(size, size),
                         interpolation=cv2.INTER_LINEAR)
    return resized.reshape(size, size, -1).transpose(2, 0, 1)


def _check_image(index, image) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[0] != 3 or image.dtype.kind not in "iuf":
        raise ValueError(f"images[{index}] has shape {image.shape} and dtype {image.dtype}; "
                         "expected numbers (3, H, W): RGB, channels first, 0-255 (read_rgb "
                         "gives that)")
    image = image.astype(np.float32)
    if not np.isfinite(image).all():
        raise ValueError(f"images[{index}] holds nan or inf values; expected finite 0-255")
    return image


class OnnxDetector:
    """An SSD exported by ``medaidet export``, run with onnxruntime.

    ``preset``: ``"evaluate"`` (score >= 0.01, what mAP and counts are computed from; the
    default) or ``"visualize"`` (score >= 0.6); ``score_thresh``/``nms_thresh`` override it.
    ``threads``: onnxruntime's threads per operator (None: its default, one per core).
    ``label_names``, ``insize``, ``model`` (the SSD's name) come from the file.
    """

    def __init__(self, path, preset: str = "evaluate", score_thresh=None, nms_thresh=None,
                 providers=("CPUExecutionProvider",), threads=None):
        path = Path(os.fspath(path))
        if not path.is_file():
            raise ModelFileError(f"no model at {path}: write one with `medaidet export "
                                 f"WEIGHTS --out {path}`")
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        try:
            self.session = onnxruntime.InferenceSession(str(path), options,
                                                        providers=list(providers))
        except Exception as exc:     # onnxruntime's own errors name no class worth catching
            raise ModelFileError(f"{path} is not an ONNX model onnxruntime can load "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from None
        meta = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        if meta is None:
            raise ModelFileError(f"{path} is an ONNX model, but not one `medaidet export` "
                                 "wrote: it has no default boxes to decode with")
        meta = json.loads(meta)
        self.path = path
        self.model = meta["model"]
        self.insize = int(meta["insize"])
        self.label_names = tuple(meta["label_names"])
        self.default_boxes = np.asarray(meta["default_boxes"], dtype=np.float64)
        self.variances = tuple(meta["variances"])
        self.top_k, self.keep_top_k = meta["top_k"], meta["keep_top_k"]
        if preset not in meta["presets"]:
            raise ValueError(f"preset {preset!r}: expected one of {sorted(meta['presets'])}")
        chosen = meta["presets"][preset]
        self.score_thresh = chosen["score_thresh"] if score_thresh is None else score_thresh
        self.nms_thresh = chosen["nms_thresh"] if nms_thresh is None else nms_thresh

    def raw(self, images):
        """The graph's outputs for ``images`` (each (3, H, W) RGB 0-255): ``(locs, scores,
        sizes)``, (B, K, 4), (B, K, n_fg_class + 1) and each image's (H, W)."""
        images = [_check_image(i, image) for i, image in enumerate(images)]
        if not images:
            k = len(self.default_boxes)
            return (np.zeros((0, k, 4), np.float32),
                    np.zeros((0, k, len(self.label_names) + 1), np.float32), [])
        outputs = [self.session.run(["locs", "scores"],   # the graph takes one image
                                    {"image": resize_image(image, self.insize)[None]})
                   for image in images]
        return (np.concatenate([locs for locs, _ in outputs]),
                np.concatenate([scores for _, scores in outputs]),
                [image.shape[1:] for image in images])

    def predict(self, images):
        """``(bboxes, labels, scores)``, one array per image, as ChainerCV's ``predict``:
        float32 (R, 4) ``(y_min, x_min, y_max, x_max)`` in the image's pixels, int32 (R,),
        float32 (R,)."""
        locs, scores, sizes = self.raw(images)
        bboxes, labels, out_scores = [], [], []
        for loc, score, size in zip(locs, scores, sizes):
            bbox, label, score = decode(loc, score, self.default_boxes, self.variances,
                                        self.score_thresh, self.nms_thresh,
                                        self.top_k, self.keep_top_k)
            bboxes.append(resize_boxes(bbox, (self.insize, self.insize), size))
            labels.append(label)
            out_scores.append(score)
        return bboxes, labels, out_scores

    def count(self, image, score_thresh: float = COUNT_SCORE_THRESH) -> dict:
        """Cells per class in ``image``: its detections scoring ``>= score_thresh``."""
        _, labels, scores = self.predict([image])
        counted = labels[0][scores[0] >= score_thresh]
        return {name: int((counted == i).sum()) for i, name in enumerate(self.label_names)}
