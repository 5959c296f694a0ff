"""medaidet: blood-cell detection on BCCD with ChainerCV's SSD.

Importing the package applies the runtime compatibility settings once
(see :mod:`medaidet.compat`). It never imports chainer itself, so
``python -m medaidet stack install`` runs before chainer exists.
"""
from medaidet import compat as _compat

__version__ = "0.1.0"

compat_actions = _compat.apply()

__all__ = ["__version__", "compat_actions"]
