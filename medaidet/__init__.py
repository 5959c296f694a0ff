"""medaidet: blood-cell detection on BCCD with ChainerCV's SSD.

Importing it applies :mod:`medaidet.compat` once, never importing chainer (``stack install``
runs before chainer exists).
"""
from medaidet import compat as _compat

__version__ = "0.1.0"

compat_actions = _compat.apply()

__all__ = ["__version__", "compat_actions"]
