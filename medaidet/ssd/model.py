"""SSD300, SSD512 and SSDSmall for the BCCD classes, built with the weights they start from.

``pretrained`` (:func:`build_ssd`; SSDSmall takes only ``None`` or a path):

* ``None``: random initialization (lazily shaped, as ChainerCV's).
* ``'imagenet'``: ImageNet VGG-16 for the extractor's VGG layers, the rest random, from the
  first source that works (:data:`medaidet.ssd.weights.SOURCES`).
* ``'voc0712'``: ChainerCV's PASCAL VOC model except the class-score heads
  (``multibox/conf/*``), which stay random: ChainerCV refuses these weights unless
  ``n_fg_class == 20``, but the extractor and box regressors do not depend on the classes.
* a path: a model-only ``.npz`` (:func:`~medaidet.ssd.weights.save_weights`) of the same
  architecture and classes, loaded completely; a ``.sha256`` sidecar is verified.

What was loaded: ``model.weights_report`` (:class:`~medaidet.ssd.weights.WeightsReport`),
also logged at INFO level.
"""
from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path

import numpy as np
from chainercv.links import SSD300, SSD512

from medaidet.data import BCCD_LABEL_NAMES
from medaidet.ssd import MODEL_NAMES
from medaidet.errors import WeightsError
from medaidet.ssd.small import SSDSmall
from medaidet.ssd.weights import (CLASS_HEADS, check_pretrained, load_weights, pretrained_file,
                                  what_file_is)

__all__ = ["MODELS", "build_ssd", "model_of_weights"]

logger = logging.getLogger(__name__)

#: Model name (:data:`medaidet.ssd.MODEL_NAMES`) -> ChainerCV class, for :func:`build_ssd`.
MODELS = dict(zip(MODEL_NAMES, (SSD300, SSD512, SSDSmall)))


def build_ssd(name: str = "ssd300", pretrained=None,
              n_fg_class: int = len(BCCD_LABEL_NAMES)):
    """ChainerCV's ``SSD300``/``SSD512`` for ``n_fg_class`` classes, with ``pretrained`` weights.

    Returns the model in the 'visualize' preset (``use_preset('evaluate')`` before computing AP),
    materialized when weights were loaded. WeightsError kinds: "missing", "mismatch" (names the
    parameter), "checksum" (differs from its ``.sha256``), "file" (not a readable ``.npz`` of
    arrays), "not_finite".
    """
    cls = MODELS.get(str(name).lower())
    if cls is None:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")
    check_pretrained(name, pretrained)
    if not isinstance(n_fg_class, (int, np.integer)) or isinstance(n_fg_class, bool) \
            or n_fg_class < 1:
        raise ValueError(f"n_fg_class must be a positive int, got {n_fg_class!r}")
    model = cls(n_fg_class=int(n_fg_class))
    report = None
    if pretrained in ("imagenet", "voc0712"):
        path, source, how = pretrained_file(name, pretrained)
        report = load_weights(model, path, origin=f"{source.describe()}, {how}",
                              backbone=pretrained == "imagenet",
                              skip=CLASS_HEADS if pretrained == "voc0712" else None)
    elif pretrained is not None:
        path = Path(os.fspath(pretrained))
        if not path.is_file():
            raise WeightsError(
                f"no weight file at {path}: pretrained must be None, 'imagenet', 'voc0712' "
                f"or the path of an .npz saved by medaidet.ssd.weights.save_weights",
                "missing", path=path)
        report = load_weights(model, path)

    model.weights_report = report
    if report is not None:
        logger.info("%s %s", name, report.summary())
    return model


def model_of_weights(path) -> str:
    """The model (:data:`~medaidet.ssd.MODEL_NAMES`) a model-only ``.npz`` was saved from, by its
    parameter names (zip directory only); ``ssd300`` for an unreadable file, which
    :func:`load_weights` then explains."""
    path = Path(path)
    try:
        if what_file_is(path) is not None:
            return "ssd300"
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return "ssd300"
    if any(name.startswith("extractor/0/") for name in names):
        return "ssd_small"
    return "ssd512" if "multibox/loc/6/W.npy" in names else "ssd300"
