"""From an SSD's raw outputs to detections, in NumPy only (no chainer).

The same steps, in the same order and precision, as ChainerCV's ``MultiboxCoder.decode`` with
the caps of :func:`medaidet.ssd.predict.decode_capped` (tests/deploy compares the two on the
test images): each default box's offsets become a box; per class, the candidates scoring at
least ``score_thresh`` are capped to the ``top_k`` best, non-maximum suppression keeps a box
unless it overlaps a better one of its class at IoU >= ``nms_thresh``; the image keeps its
``keep_top_k`` best detections. Boxes are ``(y_min, x_min, y_max, x_max)``.
"""
import numpy as np

__all__ = ["boxes_from_offsets", "box_iou", "non_maximum_suppression", "decode", "resize_boxes"]


def boxes_from_offsets(locs, default_boxes, variances):
    """``locs`` (K, 4) offsets of the default boxes ``(center y, center x, height, width)``
    (K, 4) -> boxes (K, 4) ``(y_min, x_min, y_max, x_max)`` (float64, as ChainerCV's)."""
    boxes = np.array(default_boxes, dtype=np.float64)        # a copy
    sizes = boxes[:, 2:].copy()
    boxes[:, :2] += locs[:, :2] * variances[0] * sizes        # centre shift
    boxes[:, 2:] *= np.exp(locs[:, 2:] * variances[1])        # size ratio
    boxes[:, :2] -= boxes[:, 2:] / 2                          # (centre, size) -> (min, size)
    boxes[:, 2:] += boxes[:, :2]                              # -> (min, max)
    return boxes


def box_iou(a, b):
    """IoU of every box of ``a`` (N, 4) with every box of ``b`` (M, 4): (N, M). Boxes
    ``(y_min, x_min, y_max, x_max)``; boxes that do not overlap have IoU 0."""
    a, b = np.asarray(a)[:, None], np.asarray(b)[None]
    top_left = np.maximum(a[..., :2], b[..., :2])
    bottom_right = np.minimum(a[..., 2:], b[..., 2:])
    overlap = np.prod(bottom_right - top_left, axis=2) * (top_left < bottom_right).all(axis=2)
    area_a = np.prod(a[..., 2:] - a[..., :2], axis=2)
    area_b = np.prod(b[..., 2:] - b[..., :2], axis=2)
    return overlap / (area_a + area_b - overlap)


def non_maximum_suppression(boxes, thresh, scores, limit=None):
    """Indices of the boxes kept, best score first: a box is dropped when its IoU with a
    kept, better-scoring box is >= ``thresh``; at most ``limit`` are kept."""
    if len(boxes) == 0:
        return np.zeros((0,), dtype=np.int32)
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
    """One image's detections from its ``locs`` (K, 4) and class probabilities ``scores``
    (K, n_fg_class + 1; column 0 background): ``(boxes, labels, scores)``, float32 (R, 4) in
    the model's input frame, int32 (R,) in ``[0, n_fg_class)``, float32 (R,); grouped by
    label, each group best first. ``top_k``/``keep_top_k``: None for no cap."""
    all_boxes = boxes_from_offsets(locs, default_boxes, variances)
    out_boxes, out_labels, out_scores = [], [], []
    for label in range(scores.shape[1] - 1):
        score = scores[:, label + 1]
        mask = score >= score_thresh
        boxes, score = all_boxes[mask], score[mask]
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
