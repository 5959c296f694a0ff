"""BCCD data: pinned download, validating loader, validation report; TXL-PBC's re-annotation
of it.

Names are imported lazily so that ``medaidet data download`` needs no chainer; for the same
reason :data:`SPLITS` and :data:`BCCD_LABEL_NAMES` are here (the command line offers them).
"""
import importlib

from medaidet.colors import CLASS_COLORS   # one colour per class (medaidet.colors)

#: BCCD's image sets, ``ImageSets/Main/<split>.txt``.
SPLITS = ("train", "val", "trainval", "test")
#: Class names in the course's order: label 0 is rbc, 1 wbc, 2 platelets. The XML
#: says ``RBC``, ``WBC``, ``Platelets``; names are matched case-insensitively, stripped.
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
