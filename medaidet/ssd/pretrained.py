"""Where a model's starting weights come from: ChainerCV's named pretrained weights (PASCAL
VOC) in ChainerCV's model cache, and the trained weights that ship with medaidet. (ImageNet
VGG-16 has several sources: :mod:`medaidet.ssd.imagenet`.)

Named weights come from ChainerCV's model cache, the same files ChainerCV uses:
``<dataset root>/pfnet/chainercv/models/<the URL's file name>``, where the dataset root is
``$CHAINER_DATASET_ROOT`` (default ``~/.chainer/dataset``; see
``chainer.dataset.set_dataset_root``). A missing file is downloaded by ChainerCV's
``download_model``; offline, a ``"missing"`` WeightsError says
which file to place where and the URL it comes from.
"""
from __future__ import annotations

import http.client
import os
from pathlib import Path

from chainer.dataset import get_dataset_root
from chainercv.links import SSD300, SSD512
from chainercv.utils import download as _cv_download

from medaidet.ssd import MODEL_NAMES, PRETRAINED, WITH_PRETRAINED
from medaidet.errors import WeightsError

__all__ = ["CACHE_SUBDIR", "SHIPPED_WEIGHTS", "check_pretrained", "pretrained_url",
           "pretrained_cache_path", "pretrained_file", "shipped_weights"]

#: ChainerCV's model cache, relative to the dataset root (see ``download_model``).
CACHE_SUBDIR = os.path.join("pfnet", "chainercv", "models")
#: Trained weights that ship with the package (model-only, float16, with ``.sha256`` and a
#: ``.json`` that says how they were made), by (model, the labels they were trained on): the
#: small SSD trained on a CPU on BCCD's boxes, so that the evaluation and counting notebooks
#: show a working detector at once, and on TXL-PBC's re-annotation of the same images
#: (notebook 10), the detector whose counts can be checked against the fuller labels.
SHIPPED_WEIGHTS = {("ssd_small", "bccd"): Path(__file__).parent / "weights" / "ssd_small_bccd.npz",
                   ("ssd_small", "txl-pbc"):
                       Path(__file__).parent / "weights" / "ssd_small_txl-pbc.npz"}
#: The ChainerCV classes whose ``_models`` table holds the URLs (:data:`WITH_PRETRAINED`).
_CLASSES = {"ssd300": SSD300, "ssd512": SSD512}


def check_pretrained(name: str, pretrained) -> None:
    """a ``"missing"`` WeightsError when ``pretrained`` names weights (``'imagenet'``,
    ``'voc0712'``) that model ``name`` does not have."""
    if pretrained in PRETRAINED and str(name).lower() not in WITH_PRETRAINED:
        raise WeightsError(
            f"{name} has no {pretrained!r} weights (only {', '.join(WITH_PRETRAINED)} do): "
            f"train it from random weights (pretrained None, --pretrained none) or load a "
            f"model-only .npz of it", "missing", path=Path(str(pretrained)))


def pretrained_url(name: str = "ssd300", pretrained: str = "voc0712") -> str:
    """The URL ChainerCV downloads ``pretrained`` weights of model ``name`` from."""
    if str(name).lower() not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODEL_NAMES)}")
    check_pretrained(name, pretrained)
    if pretrained not in PRETRAINED:
        raise ValueError(f"unknown pretrained weights {pretrained!r}: use one of "
                         f"{', '.join(PRETRAINED)}, a file path, or None")
    return _CLASSES[str(name).lower()]._models[pretrained]["url"]


def pretrained_cache_path(name: str = "ssd300", pretrained: str = "voc0712") -> Path:
    """Where ChainerCV keeps (and looks for) that file: ``<root>/pfnet/chainercv/models/<name>``.

    Computed as ChainerCV's ``download_model`` does (the URL's base name under
    ``get_dataset_directory('pfnet/chainercv/models')``), without creating anything.
    """
    url = pretrained_url(name, pretrained)
    return Path(get_dataset_root(), CACHE_SUBDIR, os.path.basename(url))


def shipped_weights(name: str = "ssd_small", labels: str = "bccd") -> Path:
    """The trained weights of ``name`` that ship with medaidet, trained on ``labels``
    (``'bccd'`` or ``'txl-pbc'``; :data:`SHIPPED_WEIGHTS`); their ``.json`` says the command
    and seed that reproduce them and how they score.

    Raises a ``"missing"`` WeightsError when medaidet ships none for ``name`` or the file
    is missing from this installation."""
    if (name, labels) not in SHIPPED_WEIGHTS:
        shipped = ", ".join(f"{n} ({l})" for n, l in SHIPPED_WEIGHTS)
        raise WeightsError(
            f"medaidet ships trained weights only for {shipped}, not {name!r} trained on "
            f"{labels!r} labels: train {name} (`medaidet train`) and use its model.npz",
            "missing", path=None)
    path = SHIPPED_WEIGHTS[name, labels]
    if not path.is_file():
        raise WeightsError(
            f"the shipped weights {path} are missing from this installation: reinstall "
            f"medaidet (pip install -e <checkout>), or train them: `medaidet train "
            f"--profile cpu`", "missing", path=path)
    return path


def pretrained_file(name: str = "ssd300", pretrained: str = "voc0712") -> Path:
    """The cached weight file, downloaded by ChainerCV's ``download_model`` if missing.

    Raises:
        WeightsError: ``"missing"``: not cached and the download failed (offline, HTTP error).
            ``.path`` is where to place the file, ``.url`` where it comes from.
    """
    url = pretrained_url(name, pretrained)
    path = pretrained_cache_path(name, pretrained)
    if path.is_file():
        return path
    try:
        return Path(_cv_download.download_model(url))
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        reason = getattr(exc, "reason", None) or exc
        raise WeightsError(
            f"the {pretrained!r} weights for {name} are not in ChainerCV's cache and could "
            f"not be downloaded ({type(exc).__name__}: {reason}).\n"
            f"Place the file at:\n    {path}\n"
            f"It comes from:\n    {url}\n"
            f"(download it where there is network access and copy it there; the cache root "
            f"is $CHAINER_DATASET_ROOT, default ~/.chainer/dataset)",
            "missing", path=path, url=url) from None
