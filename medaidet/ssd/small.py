"""SSDSmall: ChainerCV's SSD with a small extractor, that a CPU trains on BCCD in minutes.

:class:`SmallExtractor` builds SSD300's six feature maps (grids 38, 19, 10, 5, 3 and 1 for a
300x300 image) from 3x3 convolutions with batch normalisation (which lets them train from
random weights): about 1 M parameters against VGG-16's 23 M. The rest is ChainerCV's SSD with
SSD300's grids, aspect ratios and heads, so coder, loss, transforms and prediction are
SSD300's; only the default boxes' sizes differ (:data:`SIZES`).
"""
from __future__ import annotations

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainercv.links.model.ssd import SSD, Multibox

__all__ = ["SSDSmall", "SmallExtractor"]

# SSD300's (chainercv.links.model.ssd.ssd_vgg16).
STEPS = (8, 16, 32, 64, 100, 300)
SSD300_SIZES = (30, 60, 111, 162, 213, 264, 315)
# At 300x300 (notebook 01) platelets are ~21 px, red cells 55, white cells 102. SSD300's
# 30-px boxes meet a median platelet (18x24) at IoU < 0.5, 20-px ones at 0.7-0.8; 51 fits
# the red cells on the 19x19 map.
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
    ``widths``: the channels of the stem (150 and 75 pixels) and of each of the six maps."""

    insize = 300
    grids = (38, 19, 10, 5, 3, 1)

    def __init__(self, widths=(16, 32, 64, 128, 128, 128, 128, 128)):
        stem1, stem2, *maps = widths
        if len(maps) != len(self.grids):
            raise ValueError(f"widths: 2 stem widths and {len(self.grids)} map widths, got "
                             f"{len(widths)} numbers")
        # 300 -> 150 -> 75 (stem), then per map a stride-2 block and one more; 5 -> 3 -> 1 unpadded
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
    """SSD with :class:`SmallExtractor`, SSD300's grids and aspect ratios, default boxes sized
    for BCCD (``sizes``; :data:`SSD300_SIZES` are SSD300's) and random initial weights."""

    def __init__(self, n_fg_class: int, widths=None, sizes=SIZES):
        extractor = SmallExtractor() if widths is None else SmallExtractor(widths)
        super().__init__(
            extractor=extractor,
            multibox=Multibox(n_class=n_fg_class + 1, aspect_ratios=ASPECT_RATIOS),
            steps=STEPS, sizes=tuple(sizes), mean=MEAN)
