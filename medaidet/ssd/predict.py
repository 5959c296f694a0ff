"""SSD prediction with the candidates per class capped before NMS, as the original SSD does.

ChainerCV's ``SSD.predict`` sends *every* prior whose class score passes ``score_thresh`` to
non-maximum suppression. With the 'evaluate' preset (``score_thresh=0.01``) and an untrained
or barely trained model, that is all 8732 priors of SSD300 for every class, and ChainerCV's
CPU NMS is a Python loop over them: tens of seconds per image. The original SSD (Caffe,
``DetectionOutput``: ``nms_param.top_k: 400``, ``keep_top_k: 200``) keeps only the
``top_k`` highest-scoring candidates of each class before NMS and the ``keep_top_k``
highest-scoring detections of the image after it; this module does the same.

What holds:

* When no cap binds (every class has at most ``top_k`` candidates and at most
  ``keep_top_k`` detections survive NMS), the output is identical to ChainerCV's
  ``model.predict``: same arrays, same order, same dtypes. ``top_k=None`` and
  ``keep_top_k=None`` switch the caps off.
* When ``top_k`` binds for a class whose scores are distinct, that class's detections are
  exactly the first detections of ChainerCV's list for the class (a prefix: those scoring
  at least the ``top_k``-th best candidate): greedy NMS keeps or drops a box by looking
  only at higher-scoring boxes, and the cap removes only lower-scoring ones. With tied
  scores, which of the tied boxes survives may differ.
* ``keep_top_k`` keeps the highest-scoring detections of the image, in ChainerCV's order.
* Ties at a cap are broken by prior index, lower first (deterministic on CPU and GPU).
* Order, as ChainerCV: grouped by label (0, 1, ...), each group by descending score.

``score_thresh`` and ``nms_thresh`` are the model's (``model.use_preset``).

Boxes are ``(y_min, x_min, y_max, x_max)`` in the input image's pixels, float32, shape
(R, 4); labels int32 (R,) in ``[0, n_fg_class)``; scores float32 (R,). Works on NumPy and
CuPy arrays alike (the model's ``xp``); :func:`predict` returns NumPy arrays, as ChainerCV.
"""
from __future__ import annotations

import chainer
import numpy as np
from chainercv import transforms
from chainercv.utils import non_maximum_suppression

__all__ = ["DEFAULT_TOP_K", "DEFAULT_KEEP_TOP_K", "decode_capped", "predict",
           "CappedPredictor"]

#: Candidates kept per class before NMS (Caffe SSD's ``nms_param.top_k``).
DEFAULT_TOP_K = 400
#: Detections kept per image after NMS (Caffe SSD's ``keep_top_k``).
DEFAULT_KEEP_TOP_K = 200


def _check_cap(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def _top(xp, score, k):
    """Indices of the ``k`` highest scores, ties by lower index, returned in index order."""
    order = xp.argsort(-score, kind="stable")[:k]
    return xp.sort(order)


def decode_capped(coder, mb_loc, mb_conf, nms_thresh=0.45, score_thresh=0.6,
                  top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K):
    """ChainerCV's ``MultiboxCoder.decode`` with the candidates capped (see the module docs).

    Args:
        coder: the model's ``chainercv.links.model.ssd.MultiboxCoder`` (``model.coder``).
        mb_loc: float array (K, 4), one image's box offsets (K default boxes).
        mb_conf: float array (K, n_fg_class + 1), one image's class logits; column 0 is
            the background.
        nms_thresh: IoU threshold of NMS; ``None``: no NMS (as ChainerCV).
        score_thresh: candidates need a class score ``>=`` this.
        top_k: candidates kept per class before NMS (``None``: all).
        keep_top_k: detections kept per image after NMS (``None``: all).

    Returns:
        ``(bbox, label, score)`` on the arrays' device: float32 (R, 4)
        ``(y_min, x_min, y_max, x_max)`` in the model's input frame (insize x insize),
        int32 (R,), float32 (R,).
    """
    top_k = _check_cap("top_k", top_k)
    keep_top_k = _check_cap("keep_top_k", keep_top_k)
    xp = chainer.backend.get_array_module(mb_loc)

    # The same expressions as MultiboxCoder.decode: its default boxes are float64, so the
    # boxes NMS sees are float64 too; computing them any other way could flip an IoU
    # that sits exactly at the threshold.
    default_bbox = coder._default_bbox
    variance = coder._variance
    mb_bbox = default_bbox.copy()
    mb_bbox[:, :2] += mb_loc[:, :2] * variance[0] * default_bbox[:, 2:]
    mb_bbox[:, 2:] *= xp.exp(mb_loc[:, 2:] * variance[1])
    mb_bbox[:, :2] -= mb_bbox[:, 2:] / 2   # (center, size) -> (min, size)
    mb_bbox[:, 2:] += mb_bbox[:, :2]       # -> (y_min, x_min, y_max, x_max)
    mb_score = xp.exp(mb_conf)
    mb_score /= mb_score.sum(axis=1, keepdims=True)

    bbox, label, score = [], [], []
    for fg in range(mb_conf.shape[1] - 1):
        score_l = mb_score[:, fg + 1]       # column 0 is the background
        mask = score_l >= score_thresh
        bbox_l = mb_bbox[mask]
        score_l = score_l[mask]
        if top_k is not None and len(score_l) > top_k:
            keep = _top(xp, score_l, top_k)
            bbox_l, score_l = bbox_l[keep], score_l[keep]
        if nms_thresh is not None:
            # No class can contribute more than keep_top_k detections to the image, so
            # NMS may stop there (its result is then a prefix of the full one).
            indices = non_maximum_suppression(bbox_l, nms_thresh, score_l, limit=keep_top_k)
            bbox_l, score_l = bbox_l[indices], score_l[indices]
        bbox.append(bbox_l)
        label.append(xp.full((len(bbox_l),), fg, dtype=np.int32))
        score.append(score_l)

    bbox = xp.vstack(bbox).astype(np.float32)
    label = xp.hstack(label).astype(np.int32)
    score = xp.hstack(score).astype(np.float32)
    if keep_top_k is not None and len(score) > keep_top_k:
        keep = _top(xp, score, keep_top_k)   # index order keeps ChainerCV's ordering
        bbox, label, score = bbox[keep], label[keep], score[keep]
    return bbox, label, score


def predict(model, imgs, top_k=DEFAULT_TOP_K, keep_top_k=DEFAULT_KEEP_TOP_K):
    """``model.predict(imgs)`` of a ChainerCV SSD, with the candidates capped.

    Args:
        model: a ChainerCV ``SSD`` (``SSD300``/``SSD512``); its ``score_thresh`` and
            ``nms_thresh`` (``model.use_preset``) are used.
        imgs: iterable of float arrays (3, H, W), RGB, values 0-255.
        top_k, keep_top_k: see :func:`decode_capped`.

    Returns:
        ``(bboxes, labels, scores)``: lists with one NumPy array per image, as
        ``model.predict``: float32 (R, 4) ``(y_min, x_min, y_max, x_max)`` in the image's
        pixels, int32 (R,), float32 (R,).
    """
    top_k = _check_cap("top_k", top_k)
    keep_top_k = _check_cap("keep_top_k", keep_top_k)
    xp = model.xp
    x, sizes = [], []
    for img in imgs:
        _, H, W = img.shape
        x.append(xp.array(model._prepare(img)))
        sizes.append((H, W))
    if not x:
        return [], [], []

    with chainer.using_config("train", False), chainer.no_backprop_mode():
        mb_locs, mb_confs = model(chainer.Variable(xp.stack(x)))
    mb_locs, mb_confs = mb_locs.array, mb_confs.array

    bboxes, labels, scores = [], [], []
    for mb_loc, mb_conf, size in zip(mb_locs, mb_confs, sizes):
        bbox, label, score = decode_capped(
            model.coder, mb_loc, mb_conf, model.nms_thresh, model.score_thresh,
            top_k=top_k, keep_top_k=keep_top_k)
        bbox = transforms.resize_bbox(bbox, (model.insize, model.insize), size)
        bboxes.append(chainer.backends.cuda.to_cpu(bbox))
        labels.append(chainer.backends.cuda.to_cpu(label))
        scores.append(chainer.backends.cuda.to_cpu(score))
    return bboxes, labels, scores


class CappedPredictor(chainer.Chain):
    """A link whose ``predict`` is :func:`predict` of the wrapped SSD: pass it wherever a
    model's ``predict`` is called, e.g. ``DetectionVOCEvaluator(iterator,
    CappedPredictor(model))``.

    It holds the model itself (no copy): training the model changes what it predicts.
    ``use_preset``, ``score_thresh`` and ``nms_thresh`` read and write the model's.
    """

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
        self.model.score_thresh = value

    @property
    def nms_thresh(self):
        return self.model.nms_thresh

    @nms_thresh.setter
    def nms_thresh(self, value):
        self.model.nms_thresh = value
