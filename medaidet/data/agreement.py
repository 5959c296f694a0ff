"""How far BCCD's annotation agrees with itself: the same cells, boxed twice (notebook 05).

The two photographs of a same-field pair (``report.image_pairs``) were annotated one at a time;
:func:`count_agreement` says how far their counts agree on the part both show (a box's centre
``margin`` px inside it in both frames), as good as a count can look against one annotation."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medaidet.arguments import check_number, check_type
from medaidet.data import BCCD_LABEL_NAMES, LABELS
from medaidet.errors import ConfigError
from medaidet.data.bccd import (annotation_path, bccd_links, image_path, parse_annotation,
                                parse_yolo_labels)
from medaidet.data.image import read_image_size
from medaidet.data.download import TXL_PBC, resolve_root
from medaidet.data.same_field import ImagePair

__all__ = ["PairCounts", "pair_counts", "count_agreement"]


@dataclass(frozen=True)
class PairCounts:
    """Boxes per class on the shared part of one same-field pair: ``a`` and ``b`` are the
    image ids, ``counts_a`` and ``counts_b`` int arrays (one count per class), ``region``
    the shared rectangle in ``a``'s pixels ``(x_min, y_min, x_max, y_max)``."""
    a: str
    b: str
    splits_a: tuple
    splits_b: tuple
    region: tuple
    counts_a: np.ndarray
    counts_b: np.ndarray


def _boxes(root, image_id, txl=None):
    """(centres (N, 2) as x, y; labels (N,); (height, width)) of the usable boxes; ``txl``:
    ``(TXL-PBC's root, {BCCD id: Link})`` to read TXL-PBC's boxes instead of BCCD's."""
    if txl is None:
        ann = parse_annotation(annotation_path(root, image_id))
        size = ann.size or read_image_size(image_path(root, image_id), image_id)
    else:
        size = read_image_size(image_path(root, image_id), image_id)
        ann = parse_yolo_labels(txl[1][image_id].label_path(txl[0]), size)
    objs = [o for o in ann.objects if o.bndbox is not None and o.label is not None]
    centres = np.array([((o.bndbox[0] + o.bndbox[2]) / 2, (o.bndbox[1] + o.bndbox[3]) / 2)
                        for o in objs], dtype=float).reshape(-1, 2)
    return centres, np.array([o.label for o in objs], dtype=int), size


def pair_counts(root, pairs, margin: float = 30, label_names=BCCD_LABEL_NAMES,
                labels: str = "bccd", txl_root=None) -> list:
    """:class:`PairCounts` of each :class:`~medaidet.data.same_field.ImagePair` in ``pairs``
    with a shared part after the margin. ``root``, ``txl_root``, ``labels``: as BCCDDataset's."""
    if labels not in LABELS:
        raise ConfigError(f"labels: {labels!r} is not one of {', '.join(LABELS)}")
    margin = check_number(margin, "margin", "non-negative")
    pairs = _checked_rows(pairs, "pairs", ImagePair)
    root, txl, out, n_class = resolve_root(root), None, [], len(label_names)
    if labels == "txl-pbc":
        txl = (resolve_root(txl_root, TXL_PBC), {l.bccd_id: l for l in bccd_links()})
        pairs = [p for p in pairs if p.a in txl[1] and p.b in txl[1]]
    for pair in pairs:
        centres_a, labels_a, (h_a, w_a) = _boxes(root, pair.a, txl)
        centres_b, labels_b, (h_b, w_b) = _boxes(root, pair.b, txl)
        # b's frame in a's pixels is [dx, dx + w_b] x [dy, dy + h_b]
        x0, y0 = max(0, pair.dx) + margin, max(0, pair.dy) + margin
        x1, y1 = min(w_a, pair.dx + w_b) - margin, min(h_a, pair.dy + h_b) - margin
        if x1 <= x0 or y1 <= y0:
            continue

        def count(centres, labels):
            inside = ((centres[:, 0] >= x0) & (centres[:, 0] < x1)
                      & (centres[:, 1] >= y0) & (centres[:, 1] < y1))
            return np.bincount(labels[inside], minlength=n_class)[:n_class]

        out.append(PairCounts(pair.a, pair.b, tuple(pair.splits_a), tuple(pair.splits_b),
                              (x0, y0, x1, y1), count(centres_a, labels_a),
                              count(centres_b + [pair.dx, pair.dy], labels_b)))
    return out


def _checked_rows(rows, name: str, cls) -> list:
    rows = check_type(rows, (list, tuple), name, f"a list of {cls.__name__}")
    return [check_type(row, cls, f"{name}[{i}]", cls.__name__) for i, row in enumerate(rows)]


def count_agreement(rows, label_names=BCCD_LABEL_NAMES, exclude=()) -> dict:
    """Per class: ``(sum |a - b| / sum b + sum |a - b| / sum a) / 2`` over the pairs (None when
    a class has no box), the pairs used and the boxes of each. ``exclude``: image ids whose
    pairs are left out (e.g. the validator's ``missing_class`` images)."""
    exclude = set(exclude)
    kept = [r for r in _checked_rows(rows, "rows", PairCounts)
            if r.a not in exclude and r.b not in exclude]
    out = {}
    for l, name in enumerate(label_names):
        a = np.array([r.counts_a[l] for r in kept], dtype=float)
        b = np.array([r.counts_b[l] for r in kept], dtype=float)
        diff = np.abs(a - b).sum()
        error = float((diff / b.sum() + diff / a.sum()) / 2) if a.sum() and b.sum() else None
        out[name] = {"relative_error": error, "n_pairs": len(kept),
                     "boxes_a": int(a.sum()), "boxes_b": int(b.sum()),
                     "abs_difference": int(diff)}
    return out
