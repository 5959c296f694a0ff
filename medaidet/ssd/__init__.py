"""The detector (notebook 02): SSD built from ChainerCV, its weights, the safe multibox loss,
the train chain, the training transform and capped prediction.

:data:`MODEL_NAMES`, the names of the pretrained weights and the precisions are here, not in
:mod:`medaidet.ssd.model`, so that the command line and the training config can check names
without importing chainer.
"""

__all__ = ["MODEL_NAMES", "PRETRAINED", "WITH_PRETRAINED", "PRECISIONS"]

#: The SSD variants :func:`medaidet.ssd.model.build_ssd` builds, by name: ChainerCV's SSD300
#: and SSD512 (VGG-16), and :class:`medaidet.ssd.small.SSDSmall` (a small extractor a CPU
#: trains from scratch).
MODEL_NAMES = ("ssd300", "ssd512", "ssd_small")
#: Named pretrained weights (ChainerCV's ``_models`` keys used here).
PRETRAINED = ("imagenet", "voc0712")
#: The models that have them (SSDSmall trains from random weights).
WITH_PRETRAINED = ("ssd300", "ssd512")
#: The precisions a model trains in (:mod:`medaidet.ssd.precision`): float32; float32 with
#: TF32 matrix products on a GPU; float16 compute on float32 weights.
PRECISIONS = ("float32", "tf32", "mixed16")
