"""BCCD data: pinned download, validating loader, validation report, synthetic data.

Names are imported lazily so that ``medaidet data download`` needs no chainer; for the same
reason :data:`SPLITS` is here (the command line offers them).
"""
import importlib

#: BCCD's image sets, ``ImageSets/Main/<split>.txt``.
SPLITS = ("train", "val", "trainval", "test")

_PUBLIC = {
    "BCCD_LABEL_NAMES": "medaidet.data.bccd",
    "BCCDDataset": "medaidet.data.bccd",
    "download_bccd": "medaidet.data.download",
    "resolve_root": "medaidet.data.download",
    "validate_dataset": "medaidet.data.validate",
    "make_synthetic": "medaidet.data.synth",
}

__all__ = ["SPLITS"] + sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'medaidet.data' has no attribute {name!r}")
