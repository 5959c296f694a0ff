"""Do two runtimes detect the same cells? A comparison that score ties cannot fail.

chainer and onnxruntime compute an SSD's scores to within about 1e-7 of each other, not bit
for bit (they add up the products of a convolution in another order). Where two candidates of
a class score that close together, the two runtimes can sort them the other way round, and
both results are right:

* two detections **swap places**: each class's detections are listed best first;
* NMS **keeps the other one** of two overlapping candidates (IoU >= its threshold): one box in
  place of another, at the same score.

:func:`compare_detections` therefore matches detections image by image and class by class,
without regard to their order: a pair is *the same* when its boxes differ by at most
``box_tol`` px and its scores by at most ``score_tol``; of what is left, a pair is *a tie*
when the two boxes overlap at IoU >= ``nms_thresh`` and their scores differ by at most
``score_tol``. Anything else is a difference. The counts (detections scoring >= 0.5, per image
and class) must be equal. Boxes are ``(y_min, x_min, y_max, x_max)``. No chainer here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from medaidet.deploy.decode import box_iou
from medaidet.errors import ConfigError
from medaidet.evaluation.protocol import COUNT_SCORE_THRESH

__all__ = ["Parity", "compare_detections"]


@dataclass
class Parity:
    """What :func:`compare_detections` found (``a`` and ``b``: the two runtimes' detections).

    ``n_same``: pairs within ``box_tol`` px and ``score_tol``; ``n_ties``: pairs where NMS
    kept the other of two overlapping, equally scored candidates; ``differences``: one line per
    detection without a partner; ``box_difference``: the largest over the same pairs (px);
    ``score_difference``: the largest over all pairs; ``count_differences``: one line per image
    whose counts differ.
    """
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
        lines = [f"{self.n_images} images, {self.n_detections[0]} and {self.n_detections[1]} "
                 f"detections: {self.n_same} the same (boxes within "
                 f"{self.box_difference:.1e} px), {self.n_ties} tie{'' if self.n_ties == 1 else 's'} "
                 "(NMS kept the other of two overlapping boxes scored alike), "
                 f"{len(self.differences)} without a partner; "
                 f"scores within {self.score_difference:.1e}; "
                 + ("the same counts" if not self.count_differences else
                    f"counts differ in {len(self.count_differences)} images")]
        lines += [f"  {line}" for line in (self.differences + self.count_differences)[:10]]
        return "\n".join(lines)


def _greedy_pairs(cost, allowed):
    """Pairs ``(i, j)`` taken cheapest first among the ``allowed`` ones, each index once."""
    pairs, used_i, used_j = [], set(), set()
    for flat in np.argsort(np.where(allowed, cost, np.inf), axis=None, kind="stable"):
        i, j = np.unravel_index(flat, cost.shape)
        if not allowed[i, j]:
            break
        if i not in used_i and j not in used_j:
            pairs.append((int(i), int(j)))
            used_i.add(i)
            used_j.add(j)
    return pairs


def _counts(labels, scores, n_classes, thresh):
    return np.bincount(np.asarray(labels)[np.asarray(scores) >= thresh], minlength=n_classes)


def compare_detections(a, b, nms_thresh: float, box_tol: float = 0.5, score_tol: float = 1e-4,
                       count_thresh: float = COUNT_SCORE_THRESH, names=None) -> Parity:
    """Compare two runtimes' detections of the same images.

    ``a``, ``b``: ``(bboxes, labels, scores)``, one array per image each, as ``predict``
    returns them (float32 (R, 4), int32 (R,), float32 (R,)). ``nms_thresh``: the NMS threshold
    both used. ``names``: the images' names for the report (default: their indices).
    """
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
            left_a = np.setdiff1d(np.arange(len(ia)), [i for i, _ in same])
            left_b = np.setdiff1d(np.arange(len(ib)), [j for _, j in same])
            overlap = box_iou(box_a[left_a], box_b[left_b])
            ties = _greedy_pairs(rescored[np.ix_(left_a, left_b)],
                                 (overlap >= nms_thresh)
                                 & (rescored[np.ix_(left_a, left_b)] <= score_tol))
            parity.n_same += len(same)
            parity.n_ties += len(ties)
            parity.box_difference = max([parity.box_difference]
                                        + [float(moved[i, j]) for i, j in same])
            parity.score_difference = max(
                [parity.score_difference] + [float(rescored[i, j]) for i, j in same]
                + [float(rescored[left_a[i], left_b[j]]) for i, j in ties])
            for side, left, index, boxes, scores in (
                    ("a", left_a, ia, boxes_a, scores_a), ("b", left_b, ib, boxes_b, scores_b)):
                paired = {i if side == "a" else j for i, j in ties}
                for k in (k for n, k in enumerate(left) if n not in paired):
                    parity.differences.append(
                        f"{names[image]}: only {side} has class {label}'s box "
                        f"{np.round(boxes[index[k]], 1).tolist()} (score {scores[index[k]]:.4g})")
        counts_a = _counts(labels_a, scores_a, n_classes, count_thresh)
        counts_b = _counts(labels_b, scores_b, n_classes, count_thresh)
        if not np.array_equal(counts_a, counts_b):
            parity.count_differences.append(f"{names[image]}: counts {counts_a.tolist()} in a, "
                                            f"{counts_b.tolist()} in b")
    return parity
