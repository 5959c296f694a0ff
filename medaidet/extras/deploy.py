"""Taking the trained detector out of Chainer (notebook 09): :func:`export_onnx` writes an ONNX
model (``medaidet[export]``); :class:`OnnxDetector` runs it with onnxruntime and decodes in NumPy
(``medaidet[deploy]``). The model takes ``image`` float32 (1, 3, S, S), RGB 0-255 (the mean is
subtracted inside), and returns ``locs`` (1, K, 4), ``scores`` (1, K, n_fg_class + 1; column 0
background) and a constant ``default_boxes`` (K, 4); decoding's inputs are in the metadata too
(:data:`METADATA_KEY`). Boxes are ``(y_min, x_min, y_max, x_max)``. No chainer import at import.
"""
from __future__ import annotations

import errno
import json
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medaidet.arguments import check_number, is_path
from medaidet.data import CLASS_COLORS
from medaidet.errors import ConfigError, WeightsError
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH
from medaidet.files import not_a_regular_file

__all__ = ["boxes_from_offsets", "box_iou", "non_maximum_suppression", "decode", "resize_boxes",
           "OnnxDetector", "METADATA_KEY", "read_rgb", "resize_image", "draw_detections", "Parity",
           "compare_detections", "export_onnx", "ExportedModel", "OPSETS", "DEFAULT_OPSET"]


# --------------------------------------------------------------------------- decode
# The steps and precision of ChainerCV's ``MultiboxCoder.decode`` with the caps of
# :func:`medaidet.ssd.predict.decode_capped` (tests/deploy compares the two).

def boxes_from_offsets(locs, default_boxes, variances):
    """``locs`` (K, 4) offsets of the default boxes ``(center y, center x, height, width)``
    (K, 4) -> boxes (K, 4) ``(y_min, x_min, y_max, x_max)`` (float64, as ChainerCV's)."""
    boxes = np.array(default_boxes, dtype=np.float64)
    sizes = boxes[:, 2:].copy()
    boxes[:, :2] += locs[:, :2] * variances[0] * sizes
    boxes[:, 2:] *= np.exp(locs[:, 2:] * variances[1])
    boxes[:, :2] -= boxes[:, 2:] / 2                          # (centre, size) -> (min, size)
    boxes[:, 2:] += boxes[:, :2]                              # -> (min, max)
    return boxes


def box_iou(a, b):
    """IoU of every box of ``a`` (N, 4) with every box of ``b`` (M, 4): (N, M)."""
    a, b = np.asarray(a)[:, None], np.asarray(b)[None]
    top_left = np.maximum(a[..., :2], b[..., :2])
    bottom_right = np.minimum(a[..., 2:], b[..., 2:])
    overlap = np.prod(bottom_right - top_left, axis=2) * (top_left < bottom_right).all(axis=2)
    area_a, area_b = (np.prod(x[..., 2:] - x[..., :2], axis=2) for x in (a, b))
    return overlap / (area_a + area_b - overlap)


def non_maximum_suppression(boxes, thresh, scores, limit=None):
    """Indices of the boxes kept, best first: dropped at IoU >= ``thresh`` with a better kept one;
    at most ``limit``."""
    order = scores.argsort()[::-1]
    boxes = boxes[order]
    kept = np.zeros(len(boxes), dtype=bool)
    for i, box in enumerate(boxes):
        if (box_iou(box[None], boxes[kept]) >= thresh).any():
            continue
        kept[i] = True
        if limit is not None and np.count_nonzero(kept) >= limit:
            break
    return order[np.flatnonzero(kept)].astype(np.int32)


def _top(scores, k):
    """Indices of the ``k`` highest scores, ties by lower index, in index order."""
    return np.sort(np.argsort(-scores, kind="stable")[:k])


def decode(locs, scores, default_boxes, variances, score_thresh, nms_thresh,
           top_k=400, keep_top_k=200):
    """One image's ``(boxes, labels, scores)`` from ``locs`` (K, 4) and ``scores`` (K,
    n_fg_class + 1): float32 (R, 4) in the input frame, int32 (R,), float32 (R,); grouped by
    label, best first. ``top_k``/``keep_top_k``: None for no cap."""
    all_boxes = boxes_from_offsets(locs, default_boxes, variances)
    out_boxes, out_labels, out_scores = [], [], []
    for label in range(scores.shape[1] - 1):
        mask = scores[:, label + 1] >= score_thresh
        boxes, score = all_boxes[mask], scores[mask, label + 1]
        if top_k is not None and len(score) > top_k:
            keep = _top(score, top_k)
            boxes, score = boxes[keep], score[keep]
        if nms_thresh is not None:
            keep = non_maximum_suppression(boxes, nms_thresh, score, limit=keep_top_k)
            boxes, score = boxes[keep], score[keep]
        out_boxes.append(boxes)
        out_labels.append(np.full(len(boxes), label, dtype=np.int32))
        out_scores.append(score)
    boxes = np.vstack(out_boxes).astype(np.float32)
    labels = np.hstack(out_labels).astype(np.int32)
    scores = np.hstack(out_scores).astype(np.float32)
    if keep_top_k is not None and len(scores) > keep_top_k:
        keep = _top(scores, keep_top_k)
        boxes, labels, scores = boxes[keep], labels[keep], scores[keep]
    return boxes, labels, scores


def resize_boxes(boxes, in_size, out_size):
    """Boxes in an ``in_size`` (H, W) frame -> the same boxes in an ``out_size`` frame."""
    boxes = boxes.copy()
    boxes[:, 0::2] *= float(out_size[0]) / in_size[0]
    boxes[:, 1::2] *= float(out_size[1]) / in_size[1]
    return boxes


# --------------------------------------------------------------------------- detector

METADATA_KEY = "medaidet"


def read_rgb(path) -> np.ndarray:
    """The image at ``path`` as float32 (3, H, W), RGB 0-255, by the dataset loader's rules
    (:func:`medaidet.data.image.decode_image`, which raises the ``"image"`` DataError)."""
    from medaidet.data.image import decode_image

    return decode_image(path).pixels.astype(np.float32).transpose(2, 0, 1)


def resize_image(image, size: int) -> np.ndarray:
    """``image`` (3, H, W) float32 resized to (3, size, size), bilinear: OpenCV when it is
    installed, else Pillow, as ChainerCV's ``transforms.resize`` chooses."""
    try:
        import cv2
    except ImportError:
        from PIL import Image

        return np.stack([np.asarray(Image.fromarray(channel, mode="F").resize(
            (size, size), resample=Image.BILINEAR), dtype=np.float32) for channel in image])
    resized = cv2.resize(image.transpose(1, 2, 0), dsize=(size, size),
                         interpolation=cv2.INTER_LINEAR)
    return resized.reshape(size, size, -1).transpose(2, 0, 1)


def _check_image(index, image) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[0] != 3 or image.dtype.kind not in "iuf" or not image.size:
        raise ConfigError(
            f"images[{index}] has shape {image.shape} and dtype {image.dtype}; expected "
            "numbers (3, H, W) with H, W > 0: RGB, channels first, 0-255 (read_rgb gives that)")
    image = image.astype(np.float32)
    if not np.isfinite(image).all():
        raise ConfigError(f"images[{index}] holds nan or inf values; expected finite 0-255")
    low, high = float(image.min()), float(image.max())
    if low < 0 or high > 255:
        raise ConfigError(f"images[{index}] holds values {low:g}..{high:g}; expected 0-255 "
                          "(read_rgb gives that)")
    if high <= 1 and image.any():
        raise ConfigError(f"images[{index}] holds values {low:g}..{high:g}: scaled to 0-1? "
                          "The model expects 0-255; multiply by 255")
    return image


def _metadata(path: Path, session) -> dict:
    """The decoding metadata ``medaidet export`` wrote, checked against itself and the graph's
    shapes; a ``"file"`` WeightsError otherwise."""
    def bad(what):
        return WeightsError(f"{path} is not a model `medaidet export` wrote, or was changed since: "
                            f"{what}. Export it again from its weights.", "file", path=path)

    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise WeightsError(f"{path} is an ONNX model, but not one `medaidet export` wrote: it has "
                           "no default boxes to decode with", "file", path=path)
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise bad(f"its {METADATA_KEY!r} metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise bad(f"its metadata is a {type(meta).__name__}, not an object")
    for key, kind in {"model": str, "insize": int, "label_names": list, "default_boxes": list,
                      "variances": list, "top_k": int, "keep_top_k": int, "presets": dict}.items():
        if type(meta.get(key)) is not kind:     # JSON's types are exact: a bool is no int here
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
        values = values if isinstance(values, dict) else {}
        if not all(type(values.get(k)) in (int, float) and 0 <= values[k] <= 1
                   for k in ("score_thresh", "nms_thresh")):
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


class OnnxDetector:
    """An SSD exported by ``medaidet export``, run with onnxruntime. ``preset``: ``"evaluate"``
    (score >= 0.01, the default) or ``"visualize"`` (>= 0.6), overridden by ``score_thresh``
    and ``nms_thresh``; ``threads``: per operator (None: one per core)."""

    def __init__(self, path, preset: str = "evaluate", score_thresh=None, nms_thresh=None,
                 providers=("CPUExecutionProvider",), threads=None):
        if not is_path(path):
            raise ConfigError(f"path: {path!r} is not a file path; expected the .onnx file "
                              "`medaidet export` wrote (a str or os.PathLike)")
        path = Path(os.fspath(path))
        if (why := not_a_regular_file(path)) or not path.is_file():
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
            raise ConfigError("nms_thresh: 0 is out of range; expected a number in (0, 1] "
                              "(0 would keep one box per class)")
        try:
            self.session = onnxruntime.InferenceSession(str(path), options,
                                                        providers=list(providers))
        except Exception as exc:     # onnxruntime's own errors name no class worth catching
            raise WeightsError(f"{path} is not an ONNX model onnxruntime can load "
                               f"({type(exc).__name__}: {str(exc)[:200]})", "file",
                               path=path) from None
        meta = _metadata(path, self.session)
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
        float32 (R, 4) in the image's pixels, int32 (R,), float32 (R,)."""
        bboxes, labels, out_scores = [], [], []
        for loc, score, size in zip(*self.raw(images)):
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


# --------------------------------------------------------------------------- draw

def draw_detections(image, bboxes, labels, label_names, width: int = 2):
    """``image`` (3, H, W) RGB 0-255 as a Pillow image, each box outlined in its class's colour
    and the count per class written at the top."""
    from PIL import Image, ImageDraw, ImageFont

    picture = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0))
    pen = ImageDraw.Draw(picture)
    for (y0, x0, y1, x1), label in zip(bboxes, labels):
        pen.rectangle([float(x0), float(y0), float(x1), float(y1)],
                      outline=CLASS_COLORS[label_names[label]], width=width)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(label_names))
    try:
        font = ImageFont.load_default(size=max(12, picture.height // 28))
    except TypeError:       # Pillow < 10.1: one size only
        font = ImageFont.load_default()
    x = 4
    for name, n in zip(label_names, counts):
        text = f"{name} {n}"
        left, top, right, bottom = pen.textbbox((x, 4), text, font=font)
        pen.rectangle([left - 3, top - 3, right + 3, bottom + 3], fill="white")
        pen.text((x, 4), text, fill=CLASS_COLORS[name], font=font)
        x = right + 12
    return picture


# --------------------------------------------------------------------------- parity
# chainer and onnxruntime agree to ~1e-7, so near-equal candidates may swap or NMS keep the other
# one: match per image and class, ignoring order; *the same* within ``box_tol`` px and
# ``score_tol``, else *a tie* at IoU >= ``nms_thresh`` within ``score_tol``. Counts (score >= 0.5)
# must be equal.

@dataclass
class Parity:
    """What :func:`compare_detections` found; ``box_difference`` (px): the largest over the same
    pairs, ``score_difference``: over all pairs."""
    n_images: int
    n_detections: tuple                 # (in a, in b)
    n_same: int = 0
    n_ties: int = 0
    box_difference: float = 0.0
    score_difference: float = 0.0
    differences: list = field(default_factory=list)
    count_differences: list = field(default_factory=list)

    @property
    def same(self) -> bool:
        """Every detection has a partner, and every count is equal."""
        return not self.differences and not self.count_differences

    def __str__(self):
        counts = (f"counts differ in {len(self.count_differences)} images"
                  if self.count_differences else "the same counts")
        lines = [f"{self.n_images} images, {self.n_detections[0]} and {self.n_detections[1]} "
                 f"detections: {self.n_same} the same (boxes within {self.box_difference:.1e} "
                 f"px), {self.n_ties} tie{'' if self.n_ties == 1 else 's'} (NMS kept the other "
                 f"of two overlapping boxes scored alike), {len(self.differences)} without a "
                 f"partner; scores within {self.score_difference:.1e}; {counts}"]
        lines += [f"  {line}" for line in (self.differences + self.count_differences)[:10]]
        return "\n".join(lines)


def _greedy_pairs(cost, allowed):
    """Pairs ``(i, j)`` taken cheapest first among the ``allowed`` ones, each index once."""
    pairs = []
    for flat in np.argsort(np.where(allowed, cost, np.inf), axis=None, kind="stable"):
        i, j = np.unravel_index(flat, cost.shape)
        if not allowed[i, j]:
            break
        if all(i != p and j != q for p, q in pairs):
            pairs.append((int(i), int(j)))
    return pairs


def compare_detections(a, b, nms_thresh: float, box_tol: float = 0.5, score_tol: float = 1e-4,
                       count_thresh: float = COUNT_SCORE_THRESH, names=None) -> Parity:
    """Compare two runtimes' detections of the same images: ``a``, ``b`` as ``predict``
    returns them; ``names``: the images' names for the report (default: their indices)."""
    n_images = len(a[0])
    if any(len(part) != n_images for part in (*a, *b)):
        raise ConfigError(f"a and b must hold the same number of images ({n_images} in a's "
                          f"boxes); got {[len(part) for part in (*a, *b)]}")
    names = list(names) if names is not None else [str(i) for i in range(n_images)]
    parity = Parity(n_images, (sum(map(len, a[1])), sum(map(len, b[1]))))
    for image in range(n_images):
        (boxes_a, labels_a, scores_a), (boxes_b, labels_b, scores_b) = (
            [np.asarray(part[image]) for part in run] for run in (a, b))
        n_classes = int(max(labels_a.max(initial=-1), labels_b.max(initial=-1))) + 1
        for label in range(n_classes):
            ia, ib = np.flatnonzero(labels_a == label), np.flatnonzero(labels_b == label)
            box_a, box_b = boxes_a[ia].astype(np.float64), boxes_b[ib].astype(np.float64)
            moved = np.abs(box_a[:, None] - box_b[None]).max(axis=2, initial=0.0)
            rescored = np.abs(scores_a[ia][:, None].astype(np.float64) - scores_b[ib][None])
            same = _greedy_pairs(moved, (moved <= box_tol) & (rescored <= score_tol))
            free = np.ones(moved.shape, dtype=bool)        # neither box has a partner yet
            free[[i for i, _ in same]] = False
            free[:, [j for _, j in same]] = False
            ties = _greedy_pairs(rescored, free & (rescored <= score_tol)
                                 & (box_iou(box_a, box_b) >= nms_thresh))
            parity.n_same += len(same)
            parity.n_ties += len(ties)
            parity.box_difference = max([parity.box_difference]
                                        + [float(moved[i, j]) for i, j in same])
            parity.score_difference = max([parity.score_difference]
                                          + [float(rescored[i, j]) for i, j in same + ties])
            for side, index, boxes, scores, paired in (
                    ("a", ia, boxes_a, scores_a, {i for i, _ in same + ties}),
                    ("b", ib, boxes_b, scores_b, {j for _, j in same + ties})):
                for k in sorted(set(range(len(index))) - paired):
                    parity.differences.append(
                        f"{names[image]}: only {side} has class {label}'s box "
                        f"{np.round(boxes[index[k]], 1).tolist()} (score {scores[index[k]]:.4g})")
        counts_a, counts_b = (np.bincount(labels[scores >= count_thresh], minlength=n_classes)
                              for labels, scores in ((labels_a, scores_a), (labels_b, scores_b)))
        if not np.array_equal(counts_a, counts_b):
            parity.count_differences.append(f"{names[image]}: counts {counts_a.tolist()} in a, "
                                            f"{counts_b.tolist()} in b")
    return parity


# --------------------------------------------------------------------------- onnx compat
# onnx 1.17 removed ``onnx.mapping``, whose tables ``onnx_chainer`` (chainer 7.8.1) imports.

def apply_onnx_compat() -> bool:
    """Give ``onnx`` its ``mapping`` module back when it has none; True when it was added."""
    import onnx
    from onnx import helper

    if "onnx.mapping" in sys.modules or hasattr(onnx, "mapping"):
        return False
    module = types.ModuleType("onnx.mapping")
    module.__doc__ = "onnx.mapping's tables, rebuilt by medaidet.extras.deploy"
    module.TENSOR_TYPE_TO_NP_TYPE, module.NP_TYPE_TO_TENSOR_TYPE = {}, {}
    module.STORAGE_TENSOR_TYPE_TO_FIELD = {}
    for tensor_type in helper.get_all_tensor_dtypes():
        try:
            np_type = helper.tensor_dtype_to_np_dtype(tensor_type)
        except (KeyError, ValueError, TypeError):   # a type NumPy has no dtype for
            continue
        module.TENSOR_TYPE_TO_NP_TYPE[tensor_type] = np_type
        module.NP_TYPE_TO_TENSOR_TYPE.setdefault(np_type, tensor_type)
        # the old table named the field of the types that are stored as themselves only
        if helper.tensor_dtype_to_storage_tensor_dtype(tensor_type) == tensor_type:
            module.STORAGE_TENSOR_TYPE_TO_FIELD[tensor_type] = \
                helper.tensor_dtype_to_field(tensor_type)
    sys.modules["onnx.mapping"] = module
    onnx.mapping = module
    return True


# --------------------------------------------------------------------------- export

#: The opsets offered; 11 is the default (onnxruntime and onnxruntime-web run it). 7 and 8
#: (IR 3) would need every weight listed as a graph input, which this exporter does not write.
OPSETS = range(9, 12)
DEFAULT_OPSET = 11


@dataclass(frozen=True)
class ExportedModel:
    """What :func:`export_onnx` wrote: ``path``, the model's name, input size and opset."""

    path: Path
    model: str
    insize: int
    opset: int
    n_default_boxes: int

    def __str__(self) -> str:
        return (f"{self.path}: {self.model}, input 3x{self.insize}x{self.insize}, "
                f"{self.n_default_boxes} default boxes, ONNX opset {self.opset}")


def _pixels_in(ssd):
    """A chain from one image's pixels (1, 3, S, S), 0-255, to ``(locs, scores)``."""
    import chainer
    import chainer.functions as F

    class PixelsIn(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.ssd = ssd
            self.mean = np.asarray(ssd.mean, dtype=np.float32)[None]    # (1, 3, 1, 1)

        def forward(self, image):
            locs, confs = self.ssd(image - self.mean)
            return locs, F.softmax(confs, axis=2)

    return PixelsIn()


def decoding_metadata(model) -> dict:
    """What turns the model's outputs into detections, for the model's metadata."""
    from medaidet.data import BCCD_LABEL_NAMES
    from medaidet.evaluation.protocol import COURSE_SCORE_THRESH, EVALUATE_SCORE_THRESH
    from medaidet.ssd.predict import DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K

    coder = model.coder
    return {
        "model": model.name, "insize": int(model.insize),
        "label_names": list(BCCD_LABEL_NAMES),
        "class_colors": [CLASS_COLORS[name] for name in BCCD_LABEL_NAMES],
        "default_boxes": np.asarray(coder._default_bbox, dtype=np.float64).tolist(),
        "variances": [float(v) for v in coder._variance],
        "presets": {preset: {"score_thresh": thresh, "nms_thresh": model.nms_thresh}
                    for preset, thresh in (("evaluate", EVALUATE_SCORE_THRESH),
                                           ("visualize", COURSE_SCORE_THRESH))},
        "top_k": DEFAULT_TOP_K, "keep_top_k": DEFAULT_KEEP_TOP_K,
        "box_order": "y_min, x_min, y_max, x_max",
    }


def export_onnx(weights, out, opset: int = DEFAULT_OPSET, model_name=None) -> ExportedModel:
    """Write the SSD trained into ``weights`` (a model-only ``.npz``) as ONNX to ``out``,
    atomically. Raises ConfigError (``opset`` outside 9-11), a ``"missing"`` WeightsError, the
    weight loader's errors and ``OSError`` naming an unwritable ``out``, all before writing."""
    import onnx

    from medaidet.evaluation.evaluate import load_model
    from medaidet.files import atomic_file, check_output

    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)) or opset not in OPSETS:
        raise ConfigError(
            f"opset: {opset!r}: medaidet exports ONNX opsets {OPSETS.start} to "
            f"{OPSETS.stop - 1}; use {DEFAULT_OPSET} (onnxruntime and onnxruntime-web run it)")
    out = Path(os.fspath(out))
    if out.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give the .onnx file to write", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PermissionError(errno.EACCES, "cannot be written here (permission denied); "
                              "choose another --out", str(out))
    check_output(out, inputs=(weights,))
    model = load_model(weights, model_name=model_name, device="cpu")
    metadata = decoding_metadata(model)   # now: wrapped, the link is renamed "ssd"
    apply_onnx_compat()
    import onnx_chainer

    x = np.zeros((1, 3, model.insize, model.insize), dtype=np.float32)
    graph = onnx_chainer.export(_pixels_in(model), x, opset_version=int(opset),
                                input_names=["image"], output_names=["locs", "scores"])
    # the weights are constants (initializers), not inputs a caller could override
    g, constants = graph.graph, {t.name for t in graph.graph.initializer}
    inputs = [i for i in g.input if i.name not in constants]
    del g.input[:]
    g.input.extend(inputs)
    # a constant output, for runtimes that cannot read the metadata (a browser)
    boxes = np.asarray(metadata["default_boxes"], dtype=np.float32)
    g.initializer.append(onnx.numpy_helper.from_array(boxes, "default_boxes_value"))
    g.node.append(onnx.helper.make_node("Identity", ["default_boxes_value"], ["default_boxes"]))
    g.output.append(onnx.helper.make_tensor_value_info("default_boxes", onnx.TensorProto.FLOAT,
                                                       list(boxes.shape)))
    # the oldest IR that holds this opset: older runtimes (onnxruntime-web lags) read it
    graph.ir_version = onnx.helper.find_min_ir_version_for(list(graph.opset_import))
    onnx.helper.set_model_props(graph, {METADATA_KEY: json.dumps(metadata)})
    graph.doc_string = (f"medaidet {metadata['model']} for BCCD (rbc, wbc, platelets): image "
                        f"(1, 3, {model.insize}, {model.insize}) RGB 0-255 -> locs, scores")
    onnx.checker.check_model(graph)
    with atomic_file(out, inputs=(weights,)) as f:
        f.write(graph.SerializeToString())
    return ExportedModel(out, metadata["model"], int(model.insize), int(opset), len(boxes))
