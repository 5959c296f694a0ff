"""The detector (notebook 02): SSD built from ChainerCV, its weights, the safe multibox loss,
the train chain, the training transform and capped prediction.

:data:`MODEL_NAMES` is here, not in :mod:`medaidet.ssd.model`, so that the command line can
offer the names without importing chainer.
"""

__all__ = ["MODEL_NAMES"]

#: The SSD variants :func:`medaidet.ssd.model.build_ssd` builds, by name.
MODEL_NAMES = ("ssd300", "ssd512")
