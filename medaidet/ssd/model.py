"""SSD300, SSD512 and SSDSmall for the BCCD classes, built with the weights they start from.

:func:`build_ssd` makes ChainerCV's ``SSD300``/``SSD512`` (or :class:`~medaidet.ssd.small.SSDSmall`,
which has no pretrained weights) for ``n_fg_class`` foreground classes (default: the three
BCCD classes) and loads one of:

* ``None``: nothing; every parameter keeps its random initialization (lazily shaped, as in
  ChainerCV: the parameters get their shapes on the first forward pass).
* ``'imagenet'``: ImageNet VGG-16 weights for the extractor's VGG layers, the rest random
  (what ``SSD300(n_fg_class, pretrained_model='imagenet')`` loads), from the first source
  that works (:data:`medaidet.ssd.weights.SOURCES`); the report says which.
* ``'voc0712'``: every parameter of ChainerCV's PASCAL VOC model *except the class-score
  heads* (``multibox/conf/*``), which keep their random initialization. ChainerCV refuses
  these weights unless ``n_fg_class == 20``; the box regressors (``multibox/loc``)
  and the whole extractor do not depend on the classes, so they are reused.
* a path to an ``.npz`` file: a model-only weight file (:func:`~medaidet.ssd.weights.save_weights`)
  of a model with the same architecture and classes, loaded completely; a ``.sha256``
  sidecar is verified.

What was loaded is a :class:`~medaidet.ssd.weights.WeightsReport` (``model.weights_report``,
also logged at INFO level).
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


# --------------------------------------------------------------------------- model

def build_ssd(name: str = "ssd300", pretrained=None,
              n_fg_class: int = len(BCCD_LABEL_NAMES)):
    """ChainerCV's ``SSD300``/``SSD512`` for ``n_fg_class`` classes, with ``pretrained`` weights.

    Args:
        name: ``'ssd300'`` or ``'ssd512'``.
        pretrained: ``None``, ``'imagenet'``, ``'voc0712'`` or the path of a model-only
            ``.npz`` (see the module docstring for what each loads).
        n_fg_class: foreground classes, without the background (BCCD: 3).

    Returns:
        The model, in the 'visualize' preset (ChainerCV's default; call
        ``model.use_preset('evaluate')`` before computing AP). ``model.weights_report``
        is a :class:`WeightsReport`, or ``None`` when nothing was loaded. With weights the
        model is materialized (every parameter shaped); without, lazily shaped as ChainerCV's.

    Raises:
        WeightsError: of kind "missing" (the weight file is missing and could not be
            downloaded), "mismatch" (the file does not fit the model: names the parameter),
            "checksum" (a local file differs from its ``.sha256`` sidecar), "file" (not a
            readable ``.npz`` of arrays) or "not_finite" (NaN or infinite values).
    """
    cls = _model_class(name)
    check_pretrained(name, pretrained)
    if not isinstance(n_fg_class, (int, np.integer)) or isinstance(n_fg_class, bool) \
            or n_fg_class < 1:
        raise ValueError(f"n_fg_class must be a positive int, got {n_fg_class!r}")
    n_fg_class = int(n_fg_class)

    model = cls(n_fg_class=n_fg_class)
    if pretrained is None:
        report = None
    elif pretrained in ("imagenet", "voc0712"):
        path, source, how = pretrained_file(name, pretrained)
        report = load_weights(model, path, origin=f"{source.describe()}, {how}",
                              backbone=pretrained == "imagenet",
                              skip=CLASS_HEADS if pretrained == "voc0712" else None)
    else:
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
    """The model (a :data:`~medaidet.ssd.MODEL_NAMES` entry) a model-only ``.npz`` was saved
    from, told by its parameter names (the zip directory only, no array is read):
    ``ssd_small`` has numbered extractor stages, ``ssd512`` a seventh multibox head, else
    ``ssd300``. A file that is not a readable ``.npz`` gives ``ssd300``:
    :func:`load_weights` then says what is wrong with it."""
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


def _model_class(name: str):
    cls = MODELS.get(str(name).lower())
    if cls is None:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")
    return cls
