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

from medaidet.arguments import check_number, is_path
from medaidet.errors import ConfigError, WeightsError
from medaidet.files import not_a_regular_file
from medaidet.deploy.decode import decode, resize_boxes
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH

__all__ = ["OnnxDetector", "METADATA_KEY", "read_rgb", "resize_image"]

METADATA_KEY = "medaidet"      # the model's metadata entry written by medaidet export


def read_rgb(path) -> np.ndarray:
    """The image file at ``path`` as float32 (3, H, W), RGB, 0-255, read by the dataset
    loader's rule (:func:`medaidet.data.image.decode_image`: 16-bit grayscale scaled to 8
    bits, an opaque alpha channel dropped; transparent pixels, unreadable data and images too
    large to decode safely raise an ``"image"`` :class:`~medaidet.errors.DataError`)."""
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
    if (image.ndim != 3 or image.shape[0] != 3 or image.dtype.kind not in "iuf"
            or 0 in image.shape):
        raise ConfigError(
            f"images[{index}] has shape {image.shape} and dtype {image.dtype}; expected "
            "numbers (3, H, W) with H, W > 0: RGB, channels first, 0-255 (read_rgb gives that)")
    image = image.astype(np.float32)
    if not np.isfinite(image).all():
        raise ConfigError(f"images[{index}] holds nan or inf values; expected finite "
                                 "0-255")
    low, high = float(image.min()), float(image.max())
    if low < 0 or high > 255:
        raise ConfigError(f"images[{index}] holds values {low:g}..{high:g}; expected "
                                 "0-255 (read_rgb gives that)")
    if image.dtype.kind == "f" and high <= 1 and np.asarray(image).any():
        raise ConfigError(f"images[{index}] holds values {low:g}..{high:g}: scaled to "
                                 "0-1? The model expects 0-255; multiply by 255")
    return image


def _metadata(path: Path, session) -> dict:
    """The decoding metadata ``medaidet export`` wrote, checked against itself and against the
    graph: every field there, of its type, the default boxes finite and sized, the graph's
    ``image``/``locs``/``scores`` of the shapes they imply. A ``"file"`` WeightsError otherwise."""
    def bad(what):
        return WeightsError(f"{path} is not a model `medaidet export` wrote, or was changed "
                            f"since: {what}. Export it again from its weights.", "file",
                            path=path)

    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise WeightsError(f"{path} is an ONNX model, but not one `medaidet export` "
                           "wrote: it has no default boxes to decode with", "file", path=path)
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise bad(f"its {METADATA_KEY!r} metadata is not JSON ({exc})") from None
    need = {"model": str, "insize": int, "label_names": list, "default_boxes": list,
            "variances": list, "top_k": int, "keep_top_k": int, "presets": dict}
    if not isinstance(meta, dict):
        raise bad(f"its metadata is a {type(meta).__name__}, not an object")
    for key, kind in need.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise bad(f"its metadata has no {key} of type {kind.__name__} ({meta.get(key)!r:.40})")
    names = meta["label_names"]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise bad(f"label_names {names!r:.80} are not class names")
    if not 32 <= meta["insize"] <= 4096 or meta["top_k"] < 1 or meta["keep_top_k"] < 1:
        raise bad(f"insize {meta['insize']}, top_k {meta['top_k']}, keep_top_k "
                  f"{meta['keep_top_k']} (expected 32-4096 and positive caps)")
    try:
        boxes = np.asarray(meta["default_boxes"], dtype=np.float64)
        variances = np.asarray(meta["variances"], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise bad(f"its default boxes or variances are not numbers ({exc})") from None
    if (boxes.ndim != 2 or boxes.shape[1] != 4 or not len(boxes)
            or not np.isfinite(boxes).all() or (boxes[:, 2:] <= 0).any()):
        raise bad(f"its default boxes (shape {boxes.shape}) are not K boxes (center y, center "
                  "x, height, width) with finite values and positive sizes")
    if variances.shape != (2,) or not np.isfinite(variances).all() or (variances <= 0).any():
        raise bad(f"its variances {meta['variances']!r:.60} are not two positive numbers")
    for preset, values in meta["presets"].items():
        if (not isinstance(values, dict)
                or not all(_is_fraction(values.get(k)) for k in ("score_thresh", "nms_thresh"))):
            raise bad(f"its preset {preset!r} has no score_thresh and nms_thresh in [0, 1]")
    expected = {"image": (1, 3, meta["insize"], meta["insize"]),
                "locs": (1, len(boxes), 4), "scores": (1, len(boxes), len(names) + 1)}
    found = {t.name: t.shape for t in session.get_inputs() + session.get_outputs()}
    for name, shape in expected.items():
        if name not in found:
            raise bad(f"its graph has no {name!r} (it has {', '.join(sorted(found))})")
        fixed = [(a, b) for a, b in zip(found[name], shape) if isinstance(a, int)]
        if len(found[name]) != len(shape) or any(a != b for a, b in fixed):
            raise bad(f"its {name!r} has shape {found[name]}, where the metadata implies "
                      f"{shape} ({len(boxes)} default boxes, {len(names)} class name(s))")
    return meta


def _is_fraction(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 <= value <= 1)


class OnnxDetector:
    """An SSD exported by ``medaidet export``, run with onnxruntime.

    ``preset``: ``"evaluate"`` (score >= 0.01, what mAP and counts are computed from; the
    default) or ``"visualize"`` (score >= 0.6); ``score_thresh``/``nms_thresh`` override it.
    ``threads``: onnxruntime's threads per operator (None: its default, one per core).
    ``label_names``, ``insize``, ``model`` (the SSD's name) come from the file.
    """

    def __init__(self, path, preset: str = "evaluate", score_thresh=None, nms_thresh=None,
                 providers=("CPUExecutionProvider",), threads=None):
        if not is_path(path):
            raise ConfigError(f"path: {path!r} is not a file path; expected the .onnx "
                                     "file `medaidet export` wrote (a str or os.PathLike)")
        path = Path(os.fspath(path))
        why = not_a_regular_file(path)
        if why or not path.is_file():
            raise WeightsError(f"{path} is {why}, not a model file" if why else
                               f"no model at {path}: write one with `medaidet export "
                               f"WEIGHTS --out {path}`", "file" if why else "missing", path=path)
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = check_number(threads, "threads", integer=True)
        if score_thresh is not None:
            check_number(score_thresh, "score_thresh", "probability")
        if nms_thresh is not None and check_number(nms_thresh, "nms_thresh", "probability") == 0:
            raise ConfigError("nms_thresh: 0 is out of range; expected a number in "
                                     "(0, 1] (0 would keep one box per class)")
        try:
            self.session = onnxruntime.InferenceSession(str(path), options,
                                                        providers=list(providers))
        except Exception as exc:     # onnxruntime's own errors name no class worth catching
            raise WeightsError(f"{path} is not an ONNX model onnxruntime can load "
                               f"({type(exc).__name__}: {str(exc)[:200]})", "file",
                               path=path) from None
        meta = _metadata(path, self.session)
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
        if isinstance(images, np.ndarray) and images.ndim == 3 or not isinstance(
                images, (list, tuple, np.ndarray)):
            raise ConfigError(f"images: expected a list of images (each (3, H, W)), got "
                                     f"{type(images).__name__}; for one image pass [image]")
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
        score_thresh = check_number(score_thresh, "score_thresh", "probability")
        _, labels, scores = self.predict([image])
        counted = labels[0][scores[0] >= score_thresh]
        return {name: int((counted == i).sum()) for i, name in enumerate(self.label_names)}
