"""SSD prediction with the candidates per class capped before NMS, as the original SSD does.

ChainerCV's ``SSD.predict`` sends every prior that passes ``score_thresh`` to a Python NMS loop
(tens of seconds per image for an untrained model). Like Caffe's SSD this keeps the ``top_k``
best candidates per class before NMS and the ``keep_top_k`` best detections after it (``None``:
no cap); with no cap binding the output is ChainerCV's exactly (ties at a cap go to the lower
prior index). Images, thresholds and caps are checked first (a NaN would give no detections
without a word). Boxes float32 (R, 4) ``(y_min, x_min, y_max, x_max)``, labels int32 (R,),
scores float32 (R,), ordered as ChainerCV's.
"""
from __future__ import annotations

import reprlib
from typing import NamedTuple

import chainer
import numpy as np
from chainer.backends import cuda
from chainercv import transforms
from chainercv.utils import non_maximum_suppression

from medaidet.errors import ConfigError, DataError
from medaidet.numbers import is_real

__all__ = ["DEFAULT_TOP_K", "DEFAULT_KEEP_TOP_K", "Candidates", "decode_capped", "predict",
           "CappedPredictor"]

#: Candidates kept per class before NMS (Caffe SSD's ``nms_param.top_k``).
DEFAULT_TOP_K = 400
#: Detections kept per image after NMS (Caffe SSD's ``keep_top_k``).
DEFAULT_KEEP_TOP_K = 200


class Candidates(NamedTuple):
    """One image's candidates (default box, foreground class) of score ``>= score_thresh``
    before the caps and NMS, C in all, grouped by class, and how far each got: bool (C,) masks
    ``in_top_k``, ``after_nms`` and ``kept``, each a subset of the one before."""
    bbox: object
    label: object
    score: object
    in_top_k: object
    after_nms: object
    kept: object


def _check_cap(name, value):
    if value is not None and (isinstance(value, (bool, np.bool_))
                              or not isinstance(value, (int, np.integer)) or value < 1):
        raise ConfigError(f"{name}: {value!r} is not a valid cap; expected an int >= 1, or None "
                          "for no cap")
    return None if value is None else int(value)


def _check_score_thresh(value, name="score_thresh"):
    """``value`` unchanged if it is a number in [0, 1] (NaN fails the comparison)."""
    if not (is_real(value) and 0 <= value <= 1):
        raise ConfigError(f"{name}: {value!r} is not a valid score threshold; expected a number "
                          "from 0 to 1 (ChainerCV's presets: 'visualize' 0.6, 'evaluate' 0.01)")
    return value


def _check_nms_thresh(value, name="nms_thresh"):
    """``value`` unchanged if it is None (no NMS) or a number in (0, 1]."""
    if value is not None and not (is_real(value) and 0 < value <= 1):
        raise ConfigError(f"{name}: {value!r} is not a valid NMS threshold; expected a number "
                          "in (0, 1] (ChainerCV's presets: 0.45), or None for no NMS")
    return value


_IMAGE_FORM = "a numpy array (3, H, W) (RGB, channels first, values 0-255)"
#: What a (H, W, C) image of C channels is converted with.
_CHANNELS_LAST = {1: "np.repeat(img, 3, axis=2).transpose(2, 0, 1) (gray to RGB)",
                  3: "img.transpose(2, 0, 1)",
                  4: "img[..., :3].transpose(2, 0, 1) (without the alpha channel)"}


def _image_error(index, problem, fix, value=None):
    return DataError(f"imgs[{index}] {problem}; expected {_IMAGE_FORM}{fix}", "image", value=value)


def _check_image(index, img):
    """``img`` (the batch's ``index``-th) as a NumPy array (3, H, W) of finite numbers."""
    if isinstance(img, chainer.get_array_types()):
        img = cuda.to_cpu(img)      # ChainerCV resizes on the host
    if not isinstance(img, np.ndarray):
        kind = type(img)
        name = kind.__name__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        hint = (": convert with np.asarray(img, dtype=np.float32).transpose(2, 0, 1)"
                if hasattr(img, "getpixel") else ": convert with np.asarray(img, dtype=np.float32)"
                if isinstance(img, (list, tuple)) else "")
        raise _image_error(index, f"is a {name}", hint, value=kind)
    if img.dtype.kind not in "iuf":
        raise _image_error(index, f"has dtype {img.dtype}", " (float32, or uint8)",
                           value=img.dtype)
    shape = img.shape
    if not (img.ndim == 3 and shape[0] == 3 and min(shape[1:]) >= 1):
        problem, fix = "", ""
        if img.ndim == 3 and shape[2] in (1, 3, 4) and shape[0] not in (1, 3, 4):
            problem, fix = "channels last (H, W, C) as PIL and OpenCV give", _CHANNELS_LAST[shape[2]]
        elif img.ndim == 3 and shape[0] == 1:
            problem, fix = "one channel", "np.repeat(img, 3, axis=0)"
        elif img.ndim == 3 and shape[0] == 4:
            problem, fix = "four channels (RGBA?)", "img[:3]"
        elif img.ndim == 2:
            problem, fix = "a 2-D (H, W) image", "np.stack([img] * 3)"
        raise _image_error(index, f"has shape {shape}" + (f", {problem}" if problem else ""),
                           f": convert with {fix}" if fix else "", value=shape)
    if img.dtype.kind == "f" and not np.isfinite(img).all():
        bad = ~np.isfinite(img)
        raise DataError(f"imgs[{index}] holds {int(bad.sum())} nan/inf value(s) of {img.size}; "
                        "expected finite values 0-255 (decoded or normalised wrongly?)",
                        "image", value=float(img[bad][0]))
    return img


def _as_images(imgs):
    """The batch as a list of checked images; a single image given as the batch is named."""
    if isinstance(imgs, chainer.get_array_types()) and imgs.ndim != 4:
        raise DataError(f"imgs is one array of shape {imgs.shape}; expected a list of images, "
                        f"each {_IMAGE_FORM}: pass [img] for a single image", "image",
                        value=imgs.shape)
    try:
        imgs = list(imgs)
    except TypeError:
        raise DataError(f"imgs is {reprlib.repr(imgs)}; expected a list of images, each "
                        f"{_IMAGE_FORM}", "image", value=imgs) from None
    return [_check_image(i, img) for i, img in enumerate(imgs)]


def _top(xp, score, k):
    """Indices of the ``k`` highest scores, ties by lower index, returned in index order."""
    return xp.sort(xp.argsort(-score, kind="stable")[:k])


def decode_capped(coder, mb_loc, mb_conf, nms_thresh=0.45, score_thresh=0.6,
                  top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K,
                  return_candidates=False):
    """ChainerCV's ``MultiboxCoder.decode`` with the candidates capped, for one image's
    ``mb_loc`` (K, 4) and ``mb_conf`` (K, n_fg_class + 1). Returns ``(bbox, label, score)`` on
    the arrays' device, boxes in the model's input frame (insize x insize); with
    ``return_candidates`` also the :class:`Candidates`."""
    top_k, keep_top_k = _check_cap("top_k", top_k), _check_cap("keep_top_k", keep_top_k)
    _check_nms_thresh(nms_thresh)
    _check_score_thresh(score_thresh)
    xp = chainer.backend.get_array_module(mb_loc)
    # MultiboxCoder.decode's own float64 expressions (others could flip an IoU at the threshold)
    default_bbox, variance = coder._default_bbox, coder._variance
    mb_bbox = default_bbox.copy()
    mb_bbox[:, :2] += mb_loc[:, :2] * variance[0] * default_bbox[:, 2:]
    mb_bbox[:, 2:] *= xp.exp(mb_loc[:, 2:] * variance[1])
    mb_bbox[:, :2] -= mb_bbox[:, 2:] / 2   # (center, size) -> (min, size)
    mb_bbox[:, 2:] += mb_bbox[:, :2]       # -> (y_min, x_min, y_max, x_max)
    mb_score = xp.exp(mb_conf)
    mb_score /= mb_score.sum(axis=1, keepdims=True)

    # every candidate, by class, and the positions among them of those past the cap and NMS
    bbox, label, score, in_top_k, after_nms, n = [], [], [], [], [], 0
    for fg in range(mb_conf.shape[1] - 1):
        score_l = mb_score[:, fg + 1]       # column 0 is the background
        mask = score_l >= score_thresh
        bbox_l, score_l = mb_bbox[mask], score_l[mask]
        where = xp.arange(len(score_l))
        if top_k is not None and len(score_l) > top_k:
            where = where[_top(xp, score_l, top_k)]
        in_top_k.append(where + n)
        if nms_thresh is not None:
            # no class gives the image more than keep_top_k detections: NMS may stop there
            where = where[non_maximum_suppression(bbox_l[where], nms_thresh, score_l[where],
                                                  limit=keep_top_k)]
        after_nms.append(where + n)
        n += len(score_l)
        bbox.append(bbox_l)
        label.append(xp.full((len(score_l),), fg, dtype=np.int32))
        score.append(score_l)

    bbox = xp.vstack(bbox).astype(np.float32)
    label = xp.hstack(label)
    score = xp.hstack(score).astype(np.float32)
    kept = after_nms = xp.hstack(after_nms)
    if keep_top_k is not None and len(kept) > keep_top_k:
        kept = kept[_top(xp, score[kept], keep_top_k)]   # index order keeps ChainerCV's order
    if not return_candidates:
        return bbox[kept], label[kept], score[kept]
    masks = [xp.zeros(n, dtype=bool) for _ in range(3)]
    for mask, positions in zip(masks, (xp.hstack(in_top_k), after_nms, kept)):
        mask[positions] = True
    return bbox[kept], label[kept], score[kept], Candidates(bbox, label, score, *masks)


def predict(model, imgs, top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K,
            return_candidates=False):
    """``model.predict(imgs)`` of a ChainerCV SSD, with the candidates capped: ``imgs``
    (3, H, W), RGB, 0-255, or one (B, 3, H, W) array. Returns ``(bboxes, labels, scores)``,
    lists of NumPy arrays, boxes in the image's pixels; with ``return_candidates`` also a list
    of :class:`Candidates` (NumPy, pixels)."""
    top_k, keep_top_k = _check_cap("top_k", top_k), _check_cap("keep_top_k", keep_top_k)
    _check_score_thresh(model.score_thresh, "model.score_thresh")
    _check_nms_thresh(model.nms_thresh, "model.nms_thresh")
    imgs = _as_images(imgs)
    outputs = bboxes, labels, scores, candidates = [], [], [], []
    if imgs:
        x = model.xp.stack([model.xp.array(model._prepare(img)) for img in imgs])
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            mb_locs, mb_confs = model(chainer.Variable(x))
        insize = (model.insize, model.insize)
        for mb_loc, mb_conf, img in zip(mb_locs.array, mb_confs.array, imgs):
            bbox, label, score, *cands = decode_capped(
                model.coder, mb_loc, mb_conf, model.nms_thresh, model.score_thresh,
                top_k=top_k, keep_top_k=keep_top_k, return_candidates=return_candidates)
            bboxes.append(cuda.to_cpu(transforms.resize_bbox(bbox, insize, img.shape[1:])))
            labels.append(cuda.to_cpu(label))
            scores.append(cuda.to_cpu(score))
            for c in cands:
                c = c._replace(bbox=transforms.resize_bbox(c.bbox, insize, img.shape[1:]))
                candidates.append(Candidates(*map(cuda.to_cpu, c)))
    return outputs if return_candidates else outputs[:3]


class CappedPredictor(chainer.Chain):
    """A link whose ``predict`` is :func:`predict` of the wrapped SSD (e.g. for an evaluator);
    ``use_preset`` and the thresholds are the model's, checked when set."""

    def __init__(self, model, top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K):
        super().__init__()
        self.top_k = _check_cap("top_k", top_k)
        self.keep_top_k = _check_cap("keep_top_k", keep_top_k)
        with self.init_scope():
            self.model = model

    def predict(self, imgs):
        return predict(self.model, imgs, top_k=self.top_k, keep_top_k=self.keep_top_k)

    def forward(self, x):
        return self.model(x)

    def use_preset(self, preset):
        self.model.use_preset(preset)

    @property
    def score_thresh(self):
        return self.model.score_thresh

    @score_thresh.setter
    def score_thresh(self, value):
        self.model.score_thresh = _check_score_thresh(value)

    @property
    def nms_thresh(self):
        return self.model.nms_thresh

    @nms_thresh.setter
    def nms_thresh(self, value):
        self.model.nms_thresh = _check_nms_thresh(value)
