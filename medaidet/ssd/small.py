"""SSDSmall: ChainerCV's SSD with a small extractor, that a CPU trains on BCCD in minutes.

SSD300's VGG-16 extractor (about 23 M parameters in the extractor alone) takes seconds per
image per training step on a CPU. :class:`SmallExtractor` keeps what SSD needs from it, the
six feature maps of SSD300 (grids 38, 19, 10, 5, 3 and 1 for a 300x300 image), and builds
them from a stack of 3x3 convolutions with batch normalisation: about 1 M parameters,
trained from random weights (batch normalisation is what lets them start without
ImageNet weights). Everything else is ChainerCV's own: :class:`chainercv.links.model.ssd.SSD`
with SSD300's grids and aspect ratios and its :class:`~chainercv.links.model.ssd.Multibox`
heads, so the coder, the loss, the transforms, prediction and evaluation are the same as for
SSD300. Only the default boxes' sizes differ (:data:`SIZES`): SSD300's smallest box, 30 pixels,
is larger than most of BCCD's platelets.
"""
from __future__ import annotations

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainercv.links.model.ssd import SSD, Multibox

__all__ = ["SSDSmall", "SmallExtractor"]

# SSD300's (chainercv.links.model.ssd.ssd_vgg16): where the default boxes sit (the
# extractor's grids match them), their shapes and sizes.
STEPS = (8, 16, 32, 64, 100, 300)
SSD300_SIZES = (30, 60, 111, 162, 213, 264, 315)
# BCCD's cells at 300x300 (notebook 01): platelets about 21 pixels (sqrt of the area; 10th to
# 90th percentile 17-27), red cells 55 (47-63), white cells 102 (69-125). SSD300's 30-pixel
# boxes overlap a median platelet (18x24) at IoU below 0.5, so a platelet is a positive only
# for the one default box it is forced onto; 20-pixel boxes (and the map's sqrt(20*51) = 32,
# 14x28, 28x14) overlap it at 0.7-0.8. 51 fits the red cells on the 19x19 map; the rest as SSD300.
SIZES = (20, 51, 111, 162, 213, 264, 315)
ASPECT_RATIOS = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
MEAN = np.array((123, 117, 104), dtype=np.float32).reshape((-1, 1, 1))


class ConvBN(chainer.Chain):
    """3x3 convolution (no bias), batch normalisation, ReLU."""

    def __init__(self, out_channels, stride=1, pad=1):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(None, out_channels, 3, stride, pad, nobias=True)
            self.bn = L.BatchNormalization(out_channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class SmallExtractor(chainer.ChainList):
    """Six feature maps of a 300x300 image at SSD300's grids, from 3x3 conv + BN blocks.

    ``widths``: the channels of the stem (150 and 75 pixels) and of each of the six maps.
    """

    insize = 300
    grids = (38, 19, 10, 5, 3, 1)

    def __init__(self, widths=(16, 32, 64, 128, 128, 128, 128, 128)):
        stem1, stem2, *maps = widths
        if len(maps) != len(self.grids):
            raise ValueError(f"widths: 2 stem widths and {len(self.grids)} map widths, got "
                             f"{len(widths)} numbers")
        # 300 -> 150 -> 75 (stem), then a stride-2 block down to each map and one more block
        # on it; the last two maps come from unpadded convolutions (5 -> 3 -> 1).
        stages = [[ConvBN(stem1, 2), ConvBN(stem2, 2), ConvBN(stem2)]]
        for i, width in enumerate(maps):
            if i < 4:
                stages.append([ConvBN(width, 2), ConvBN(width)])
            else:
                stages.append([ConvBN(width, pad=0)])
        super().__init__(*[chainer.Sequential(*blocks) for blocks in stages])

    def forward(self, x):
        stem, *stages = self.children()
        h = stem(x)
        maps = []
        for stage in stages:
            h = stage(h)
            maps.append(h)
        return maps


class SSDSmall(SSD):
    """SSD with :class:`SmallExtractor`, SSD300's grids and aspect ratios, default boxes
    sized for BCCD (``sizes``, default :data:`SIZES`; :data:`SSD300_SIZES` are SSD300's) and
    ChainerCV's heads; random initial weights (there are no pretrained ones)."""

    def __init__(self, n_fg_class: int, widths=None, sizes=SIZES):
        extractor = SmallExtractor() if widths is None else SmallExtractor(widths)
        super().__init__(
            extractor=extractor,
            multibox=Multibox(n_class=n_fg_class + 1, aspect_ratios=ASPECT_RATIOS),
            steps=STEPS, sizes=tuple(sizes), mean=MEAN)
