"""SSD training augmentation for BCCD, with the boxes re-checked after augmentation.

:class:`TrainTransform` is ChainerCV's ``examples/ssd/train.py`` ``Transform`` (distort, expand,
crop, resize, flip, subtract the mean, encode) between two checks: :func:`check_sample` raises
:class:`~medaidet.errors.DataError` for a wrong sample and drops zero-size boxes;
:func:`recheck_boxes` clips the augmented boxes and drops non-finite ones and slivers under
``min_size`` px, so the encoded ``mb_loc`` is finite at every positive prior. Boxes are float32
(R, 4) ``(y_min, x_min, y_max, x_max)``, labels int32 (R,) 0-based foreground classes (the coder
adds 1). Randomness comes from Python's :mod:`random` (``random.seed(n)`` reproduces it).
"""
from __future__ import annotations

import copy
import random
import threading
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
from chainercv import transforms
from chainercv.links.model.ssd import (random_crop_with_bbox_constraints, random_distort,
                                       resize_with_random_interpolation)

from medaidet.errors import DataError

__all__ = ["TransformStats", "RecheckedBoxes", "check_sample", "CheckedTransform",
           "recheck_boxes", "TrainTransform", "EncodeTransform", "DEFAULT_MIN_SIZE"]

#: Smallest box height and width (input pixels) kept after augmentation.
DEFAULT_MIN_SIZE = 1.0


@dataclass
class TransformStats:
    """What a transform did to the boxes since it was made (or since ``reset_stats``)."""
    samples: int = 0
    boxes_in: int = 0            # boxes given to the transform
    boxes_out: int = 0           # boxes encoded
    degenerate_input: int = 0    # zero height or width as given: dropped before augmenting
    cropped_out: int = 0         # centre outside the random crop (the recipe's own drop)
    too_small: int = 0           # re-check: height or width < min_size after resize
    non_finite: int = 0          # re-check: a non-finite coordinate after augmentation
    clipped: int = 0             # re-check: moved back inside the image (rounding)

    @property
    def dropped(self) -> int:
        """Boxes the re-check dropped (``too_small + non_finite``), what training reports."""
        return self.too_small + self.non_finite

    def to_dict(self) -> dict:
        return {**asdict(self), "dropped": self.dropped}


class RecheckedBoxes(NamedTuple):
    """:func:`recheck_boxes`' result: the boxes kept and what happened to the others."""
    bbox: np.ndarray         # float32 (R', 4) (y_min, x_min, y_max, x_max), inside the image
    label: np.ndarray        # int32 (R',), aligned with bbox
    keep: np.ndarray         # bool (R,): which input rows were kept
    too_small: int
    non_finite: int
    clipped: int


def _as_arrays(bbox, label, n_fg_class):
    """``bbox`` (R, 4) and ``label`` (R,) as arrays, the labels checked to be classes."""
    bbox, label = np.asarray(bbox), np.asarray(label)
    if bbox.ndim != 2 or bbox.shape[1] != 4:
        raise DataError(f"bbox has shape {bbox.shape}; expected (R, 4) boxes (y_min, x_min, "
                        "y_max, x_max)", "shape")
    if label.shape != (len(bbox),):
        raise DataError(f"label has shape {label.shape}; expected ({len(bbox)},), one class per "
                        "box", "shape")
    if label.dtype.kind not in "iu":
        raise DataError(f"label has dtype {label.dtype}; expected integers (int32 class "
                        "indices)", "label_dtype", value=label.dtype)
    bad = np.flatnonzero((label < 0) | (label >= n_fg_class))
    if len(bad):
        i, value = int(bad[0]), int(label[bad[0]])
        hint = ("labels are 0-based foreground classes (did the dataset add 1 for background?)"
                if value == n_fg_class else "a negative label is no class" if value < 0 else
                "is n_fg_class right for this dataset?")
        raise DataError(f"box {i}: label {value} is outside [0, {n_fg_class}) ({len(bad)} such "
                        f"box(es)); {hint}. Fix the dataset's labels", "label_range",
                        box_index=i, value=value)
    return bbox, label


def check_sample(img, bbox, label, n_fg_class: int):
    """Check one ``(img, bbox, label)`` before augmenting (:class:`DataError` for an image not
    (3, H, W), mismatched shapes, bad labels, a non-finite or reversed box); return ``(bbox,
    label, keep)``: float32 boxes, int32 labels without the zero-size boxes, ``keep`` (R,)."""
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[0] != 3 or min(img.shape[1:]) < 1:
        raise DataError(f"img has shape {img.shape}; expected (3, H, W), RGB", "image")
    bbox, label = _as_arrays(bbox, label, n_fg_class)
    for bad, kind, what in (
            (~np.isfinite(bbox).all(axis=1), "non_finite_box",
             "a coordinate is not finite; fix or drop the box in the dataset"),
            ((bbox[:, 2] < bbox[:, 0]) | (bbox[:, 3] < bbox[:, 1]), "reversed_box",
             "reversed; boxes are (y_min, x_min, y_max, x_max), not (x_min, y_min, ...)")):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"box {i} is {bbox[i].tolist()}: {what}", kind, box_index=i,
                            value=bbox[i].tolist())
    keep = (bbox[:, 2] > bbox[:, 0]) & (bbox[:, 3] > bbox[:, 1])
    return bbox[keep].astype(np.float32), label[keep].astype(np.int32), keep


def recheck_boxes(bbox, label, size, n_fg_class: int,
                  min_size: float = DEFAULT_MIN_SIZE) -> RecheckedBoxes:
    """Re-check boxes after augmentation: drop non-finite ones, clip the rest to ``size``
    ``(H, W)``, drop those under ``min_size``; labels stay aligned and must lie in
    ``[0, n_fg_class)`` (else :class:`DataError`). Returns :class:`RecheckedBoxes`."""
    bbox, label = _as_arrays(bbox, label, n_fg_class)
    height, width = size
    bbox = bbox.astype(np.float32)
    finite = np.isfinite(bbox).all(axis=1)
    upper = np.array([height, width, height, width], dtype=np.float32)
    clipped_bbox = np.clip(np.where(finite[:, None], bbox, 0), 0, upper)
    big_enough = np.all(clipped_bbox[:, 2:] - clipped_bbox[:, :2] >= min_size, axis=1)
    keep = finite & big_enough
    return RecheckedBoxes(
        bbox=clipped_bbox[keep], label=label[keep].astype(np.int32), keep=keep,
        too_small=int(np.count_nonzero(finite & ~big_enough)),
        non_finite=int(np.count_nonzero(~finite)),
        clipped=int(np.count_nonzero(keep & np.any(clipped_bbox != bbox, axis=1))))


class CheckedTransform:
    """What both transforms share: the coder (on CPU), the mean, the counts and the steps
    :meth:`check` (before), :meth:`recheck` (after) and :meth:`encode`."""

    def __init__(self, coder, size: int, mean, n_fg_class: int = 3,
                 min_size: float = DEFAULT_MIN_SIZE):
        if int(n_fg_class) < 1:
            raise ValueError(f"n_fg_class must be >= 1, got {n_fg_class}")
        if not min_size > 0:
            raise ValueError(f"min_size must be > 0 pixels, got {min_size} (log(0) otherwise)")
        # a CPU copy (as ChainerCV's): the transform runs in the data-loading workers
        self.coder = copy.copy(coder)
        self.coder.to_cpu()
        self.size = int(size)
        self.mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self.n_fg_class = int(n_fg_class)
        self.min_size = float(min_size)
        self.stats = TransformStats()
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model, **kwargs):
        """The transform for a ChainerCV SSD ``model`` (its coder, insize, mean, n_fg_class)."""
        return cls(model.coder, model.insize, model.mean, n_fg_class=model.n_fg_class,
                   **kwargs)

    def reset_stats(self) -> TransformStats:
        """Start counting afresh; return the counts so far."""
        with self._lock:
            old, self.stats = self.stats, TransformStats()
        return old

    def __getstate__(self):          # picklable for MultiprocessIterator
        return {name: value for name, value in self.__dict__.items() if name != "_lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def check(self, img, bbox, label):
        """Before augmenting: :func:`check_sample`, counted; ``(img as float32, bbox, label)``."""
        bbox, label, keep = check_sample(img, bbox, label, self.n_fg_class)
        self.count(samples=1, boxes_in=len(keep), degenerate_input=int(np.count_nonzero(~keep)))
        return np.asarray(img, dtype=np.float32), bbox, label

    def recheck(self, img, bbox, label):
        """After augmenting: :func:`recheck_boxes` against ``img``, counted; ``(bbox, label)``."""
        checked = recheck_boxes(bbox, label, img.shape[1:], self.n_fg_class, self.min_size)
        self.count(too_small=checked.too_small, non_finite=checked.non_finite,
                   clipped=checked.clipped, boxes_out=len(checked.bbox))
        return checked.bbox, checked.label

    def encode(self, img, bbox, label):
        """What the loss takes: ``(img - mean, mb_loc, mb_label)`` (the coder's encoding)."""
        mb_loc, mb_label = self.coder.encode(bbox, label)
        return (img - self.mean).astype(np.float32, copy=False), mb_loc, mb_label

    def count(self, **counts):
        """Add ``counts`` to :attr:`stats` (thread-safe)."""
        with self._lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)


class TrainTransform(CheckedTransform):
    """The course's SSD augmentation, re-checked (notebook 03, section 1): ``(img, bbox, label)
    -> (img - mean, mb_loc, mb_label)``, float32 (3, size, size), float32 (K, 4), int32 (K,).
    ``coder``, ``size``, ``mean``: the model's (:meth:`for_model`). With ``MultiprocessIterator``
    each worker counts :attr:`stats` in its own copy."""

    def __init__(self, coder, size: int, mean, n_fg_class: int = 3,
                 min_size: float = DEFAULT_MIN_SIZE, expand_probability: float = 0.5,
                 max_expand_ratio: float = 4, color_distortion: bool = True):
        super().__init__(coder, size, mean, n_fg_class, min_size)
        self.expand_probability = float(expand_probability)
        self.max_expand_ratio = float(max_expand_ratio)
        self.color_distortion = bool(color_distortion)

    def augment(self, img, bbox, label):
        """The augmentation and checks without mean and encoding, for looking at samples:
        ``(img, bbox, label)``, img float32 (3, size, size) RGB 0-255."""
        img, bbox, label = self.check(img, bbox, label)
        if self.color_distortion:
            img = random_distort(img)
        if random.random() < self.expand_probability:
            img, param = transforms.random_expand(
                img, max_ratio=self.max_expand_ratio, fill=self.mean, return_param=True)
            bbox = transforms.translate_bbox(
                bbox, y_offset=param["y_offset"], x_offset=param["x_offset"])
        # boxes whose centre is outside the crop leave the sample
        img, param = random_crop_with_bbox_constraints(img, bbox, return_param=True)
        n_before = len(bbox)
        bbox, param = transforms.crop_bbox(
            bbox, y_slice=param["y_slice"], x_slice=param["x_slice"],
            allow_outside_center=False, return_param=True)
        label = label[param["index"]]
        self.count(cropped_out=n_before - len(bbox))
        _, height, width = img.shape
        img = resize_with_random_interpolation(img, (self.size, self.size))
        bbox = transforms.resize_bbox(bbox, (height, width), (self.size, self.size))
        img, param = transforms.random_flip(img, x_random=True, return_param=True)
        bbox = transforms.flip_bbox(bbox, (self.size, self.size), x_flip=param["x_flip"])
        bbox, label = self.recheck(img, bbox, label)
        return img, bbox, label

    def __call__(self, in_data):
        img, bbox, label = in_data[:3]
        img, bbox, label = self.augment(img, bbox, label)
        return self.encode(img, bbox, label)


class EncodeTransform(CheckedTransform):
    """No augmentation: resize (bilinear), re-check, subtract the mean, encode; deterministic,
    for the loss on fixed samples (validation loss). Conventions as :class:`TrainTransform`."""

    def resize(self, img, bbox, label):
        """Resized ``(img, bbox, label)``, boxes re-checked, mean not subtracted."""
        img, bbox, label = self.check(img, bbox, label)
        bbox = transforms.resize_bbox(bbox, img.shape[1:], (self.size, self.size))
        img = transforms.resize(img, (self.size, self.size))
        return (img, *self.recheck(img, bbox, label))

    def __call__(self, in_data):
        return self.encode(*self.resize(*in_data[:3]))
