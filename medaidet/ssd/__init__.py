"""The detector (notebook 02): SSD from ChainerCV, its weights, the checked multibox loss, the
train chain, the training transform and capped prediction.

The names below live here, not in :mod:`medaidet.ssd.model`, so that the command line and the
training config can check names without importing chainer.
"""

__all__ = ["MODEL_NAMES", "PRETRAINED", "WITH_PRETRAINED", "PRECISIONS"]

#: The models :func:`medaidet.ssd.model.build_ssd` builds (``ssd_small``: SSDSmall).
MODEL_NAMES = ("ssd300", "ssd512", "ssd_small")
#: Named pretrained weights (ChainerCV's ``_models`` keys).
PRETRAINED = ("imagenet", "voc0712")
#: The models that have them.
WITH_PRETRAINED = ("ssd300", "ssd512")
#: Training precisions (:mod:`medaidet.ssd.precision`).
PRECISIONS = ("float32", "tf32")
