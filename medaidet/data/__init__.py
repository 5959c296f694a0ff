"""BCCD data: pinned download, validating loader, validation report; TXL-PBC's re-annotation.

Names are imported lazily (constants live here) so that the command line needs no chainer.
"""
import importlib

from medaidet.colors import CLASS_COLORS

#: BCCD's image sets, ``ImageSets/Main/<split>.txt``.
SPLITS = ("train", "val", "trainval", "test")
#: Label 0 is rbc, 1 wbc, 2 platelets; the XML's names are matched case-insensitively.
BCCD_LABEL_NAMES = ("rbc", "wbc", "platelets")
#: Whose boxes a dataset can carry: BCCD's own, or TXL-PBC's re-annotation of its images.
LABELS = ("bccd", "txl-pbc")
#: TXL-PBC's sources that are other laboratories (medaidet.data.txl_pbc).
OTHER_SOURCES = ("PBC", "Raabin-WBC")

_PUBLIC = {
    "BCCDDataset": "medaidet.data.bccd",
    "TXLPBCDataset": "medaidet.data.txl_pbc",
    "download_bccd": "medaidet.data.download",
    "download_txl_pbc": "medaidet.data.download",
    "resolve_root": "medaidet.data.download",
    "validate_dataset": "medaidet.data.validate",
}

__all__ = ["SPLITS", "BCCD_LABEL_NAMES", "LABELS", "OTHER_SOURCES", "CLASS_COLORS"] + sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'medaidet.data' has no attribute {name!r}")
