"""SSD prediction with the candidates per class capped before NMS, as the original SSD does.

ChainerCV's ``SSD.predict`` sends every prior whose class score passes ``score_thresh`` to its
CPU NMS, a Python loop: with the 'evaluate' preset and an untrained model, all 8732 priors of
SSD300 per class, tens of seconds per image. Like Caffe's SSD (``nms_param.top_k: 400``,
``keep_top_k: 200``) this keeps the ``top_k`` best candidates of each class before NMS and the
``keep_top_k`` best detections of the image after it (``None``: no cap).

When no cap binds the output is ChainerCV's exactly (arrays, order, dtypes). When ``top_k``
binds, a class's detections are a prefix of ChainerCV's (greedy NMS looks only at
higher-scoring boxes), unless scores tie. Ties at a cap go to the lower prior index. Order as
ChainerCV's: by label, each label by descending score. ``score_thresh`` and ``nms_thresh``
are the model's (``model.use_preset``).

Checked first (a NaN would otherwise give no detections without a word): images numeric
(3, H, W) and finite, else a :class:`~medaidet.errors.DataError` naming the index;
``score_thresh`` in ``[0, 1]``, ``nms_thresh`` None or in ``(0, 1]``, the caps ints >= 1 or
None, else a :class:`~medaidet.errors.ConfigError`. Boxes float32 (R, 4) ``(y_min, x_min,
y_max, x_max)``, labels int32 (R,) in ``[0, n_fg_class)``, scores float32 (R,); NumPy or CuPy.
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
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ConfigError(f"{name}: {value!r} is not a valid cap; expected a whole number >= 1 "
                          "(an int), or None for no cap")
    return int(value)


def _check_score_thresh(value, name="score_thresh"):
    """``value`` unchanged if it is a number in [0, 1] (NaN fails the comparison)."""
    if not (is_real(value) and 0 <= value <= 1):
        raise ConfigError(
            f"{name}: {value!r} is not a valid score threshold; expected a number from 0 to 1 "
            "(a detection is kept when its class probability is >= it; ChainerCV's presets: "
            "'visualize' 0.6, 'evaluate' 0.01). Outside that range, or NaN, nothing (or "
            "everything) would pass without a word")
    return value


def _check_nms_thresh(value, name="nms_thresh"):
    """``value`` unchanged if it is None (no NMS) or a number in (0, 1]."""
    if value is not None and not (is_real(value) and 0 < value <= 1):
        raise ConfigError(
            f"{name}: {value!r} is not a valid NMS threshold; expected a number in (0, 1] "
            "(NMS drops a box whose IoU with a higher-scoring box of its class is >= it; "
            "ChainerCV's presets use 0.45), or None for no NMS. 0 or less would keep one box "
            "per class, NaN or more than 1 would suppress nothing")
    return value


_IMAGE_FORM = "a numpy array (3, H, W) (RGB, channels first, values 0-255)"


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
        hint = (": convert with np.asarray(img, dtype=np.float32).transpose(2, 0, 1) (or read "
                "it with chainercv.utils.read_image)" if hasattr(img, "getpixel") else
                ": convert with np.asarray(img, dtype=np.float32)"
                if isinstance(img, (list, tuple)) else "")
        raise _image_error(index, f"is a {name}", hint, value=kind)
    if img.dtype.kind not in "iuf":
        raise _image_error(index, f"has dtype {img.dtype}", " (float32, or uint8)",
                           value=img.dtype)
    shape = img.shape
    if img.ndim == 3 and shape[0] == 3 and min(shape[1:]) >= 1:
        pass
    elif img.ndim == 3 and shape[2] in (1, 3, 4) and shape[0] not in (1, 3, 4):
        fix = {1: "np.repeat(img, 3, axis=2).transpose(2, 0, 1) (gray to RGB)",
               3: "img.transpose(2, 0, 1)",
               4: "img[..., :3].transpose(2, 0, 1) (without the alpha channel)"}[shape[2]]
        raise _image_error(index, f"has shape {shape}, channels last (H, W, C) as PIL and "
                           "OpenCV give", f": convert with {fix}", value=shape)
    elif img.ndim == 3 and shape[0] == 1:
        raise _image_error(index, f"has shape {shape}, one channel (grayscale)",
                           ": repeat it to RGB with np.repeat(img, 3, axis=0)", value=shape)
    elif img.ndim == 3 and shape[0] == 4:
        raise _image_error(index, f"has shape {shape}, four channels (RGBA?)",
                           ": drop the alpha channel with img[:3]", value=shape)
    elif img.ndim == 2:
        raise _image_error(index, f"has shape {shape}, a 2-D (H, W) image",
                           ": make it RGB with np.stack([img] * 3)", value=shape)
    else:
        raise _image_error(index, f"has shape {shape}", "", value=shape)
    if img.dtype.kind == "f" and not np.isfinite(img).all():
        bad = ~np.isfinite(img)
        raise DataError(
            f"imgs[{index}] holds {int(bad.sum())} nan/inf value(s) of {img.size}; expected "
            "finite values 0-255: the image was decoded or preprocessed wrongly (a division "
            "by zero in a normalisation?), and a non-finite image gives no detections",
            "image", value=float(img[bad][0]))
    return img


def _as_images(imgs):
    """The batch as a list of checked images; a single image given as the batch is named."""
    if isinstance(imgs, chainer.get_array_types()) and imgs.ndim != 4:
        raise DataError(
            f"imgs is one array of shape {imgs.shape}; expected a list of images, each "
            f"{_IMAGE_FORM} (or one (B, 3, H, W) array): pass [img] for a single image",
            "image", value=imgs.shape)
    try:
        imgs = list(imgs)
    except TypeError:
        raise DataError(
            f"imgs is {reprlib.repr(imgs)}, not a list of images; expected a list of images, each "
            f"{_IMAGE_FORM}", "image", value=imgs) from None
    return [_check_image(i, img) for i, img in enumerate(imgs)]


def _top(xp, score, k):
    """Indices of the ``k`` highest scores, ties by lower index, returned in index order."""
    return xp.sort(xp.argsort(-score, kind="stable")[:k])


def _decoded(coder, mb_loc, mb_conf, xp):
    """Decoded boxes and softmax scores of every default box, by ``MultiboxCoder.decode``'s own
    float64 expressions (any other way could flip an IoU exactly at the threshold)."""
    default_bbox, variance = coder._default_bbox, coder._variance
    mb_bbox = default_bbox.copy()
    mb_bbox[:, :2] += mb_loc[:, :2] * variance[0] * default_bbox[:, 2:]
    mb_bbox[:, 2:] *= xp.exp(mb_loc[:, 2:] * variance[1])
    mb_bbox[:, :2] -= mb_bbox[:, 2:] / 2   # (center, size) -> (min, size)
    mb_bbox[:, 2:] += mb_bbox[:, :2]       # -> (y_min, x_min, y_max, x_max)
    mb_score = xp.exp(mb_conf)
    mb_score /= mb_score.sum(axis=1, keepdims=True)
    return mb_bbox, mb_score


def decode_capped(coder, mb_loc, mb_conf, nms_thresh=0.45, score_thresh=0.6,
                  top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K,
                  return_candidates=False):
    """ChainerCV's ``MultiboxCoder.decode`` with the candidates capped.

    ``mb_loc`` (K, 4) and ``mb_conf`` (K, n_fg_class + 1): one image's outputs (column 0 is the
    background). Returns ``(bbox, label, score)`` on the arrays' device, boxes in the model's
    input frame (insize x insize); with ``return_candidates`` also the :class:`Candidates`.
    """
    top_k = _check_cap("top_k", top_k)
    keep_top_k = _check_cap("keep_top_k", keep_top_k)
    _check_nms_thresh(nms_thresh)
    _check_score_thresh(score_thresh)
    xp = chainer.backend.get_array_module(mb_loc)

    mb_bbox, mb_score = _decoded(coder, mb_loc, mb_conf, xp)
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
    masks = []
    for positions in (xp.hstack(in_top_k), after_nms, kept):
        masks.append(xp.zeros(n, dtype=bool))
        masks[-1][positions] = True
    return bbox[kept], label[kept], score[kept], Candidates(bbox, label, score, *masks)


def predict(model, imgs, top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K,
            return_candidates=False):
    """``model.predict(imgs)`` of a ChainerCV SSD, with the candidates capped.

    ``imgs``: arrays (3, H, W), RGB, 0-255 (or one (B, 3, H, W) array). Returns
    ``(bboxes, labels, scores)``, lists of NumPy arrays, one per image, boxes in the image's
    pixels; with ``return_candidates`` also a list of :class:`Candidates` (NumPy, pixels).
    """
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
    """A link whose ``predict`` is :func:`predict` of the wrapped SSD (held, not copied), e.g.
    for ``DetectionVOCEvaluator``; ``use_preset`` and the thresholds are the model's, checked
    when set."""

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
