"""The SSD training chain: the model and the safe multibox loss, with the losses reported.

ChainerCV's ``examples/ssd/train.py`` ``MultiboxTrainChain`` with
:func:`medaidet.ssd.loss.multibox_loss` in place of ChainerCV's: a wrong target raises
:class:`~medaidet.errors.InvalidTargetsError` naming the sample, the prior and the value
instead of faulting inside a CUDA kernel.

Reported (``chainer.reporter.report``; under a ``Trainer`` the keys get the observer's
prefix, ``main/`` for the updater's target): ``loss`` (``loc_loss * alpha + conf_loss``),
``loss/loc`` and ``loss/conf``.
"""
from __future__ import annotations

import chainer

from medaidet.ssd.loss import multibox_loss

__all__ = ["MultiboxTrainChain"]


class MultiboxTrainChain(chainer.Chain):
    """``model`` plus the multibox loss, for ``chainer.training.StandardUpdater``: written
    in notebook 02, section 7 (the cell ``# @save medaidet/ssd/train_chain.py``).

    Args:
        model: a ChainerCV SSD (``SSD300``/``SSD512``): ``model(imgs)`` returns
            ``(mb_locs, mb_confs)`` of shapes (B, K, 4) and (B, K, n_fg_class + 1).
        alpha: weight of the localisation loss (1 in SSD and the course).
        k: hard negatives per positive (3 in SSD and the course).
        comm: a ChainerMN communicator for multi-node training, or None.
        check: validate targets and predictions before the loss (see
            :func:`medaidet.ssd.loss.multibox_loss`); False skips the checks.

    ``forward(imgs, gt_mb_locs, gt_mb_labels)``: imgs float32 (B, 3, insize, insize),
    mean subtracted; gt_mb_locs float32 (B, K, 4) and gt_mb_labels int32 (B, K) as
    encoded by the model's coder (label 0 is background), i.e. what
    :class:`medaidet.ssd.transforms.TrainTransform` returns, batched by
    ``chainer.dataset.concat_examples``. Returns the total loss (a 0-dim Variable).

    ``forward(..., n_positive=N)`` divides the losses by ``N`` instead of this batch's
    positive count (and skips ``comm``'s allreduce, which the caller did): for
    :class:`medaidet.training.accumulation.AccumulatingUpdater`, which feeds a batch in
    micro-batches and gives each the whole batch's count, so the micro-batch losses add up
    to the batch's. The reported values are then this micro-batch's share of the batch's.
    """

    def __init__(self, model, alpha: float = 1, k: int = 3, comm=None, check: bool = True):
        super().__init__()
        with self.init_scope():
            self.model = model
        self.alpha = alpha
        self.k = k
        self.comm = comm
        self.check = check

    def forward(self, imgs, gt_mb_locs, gt_mb_labels, n_positive=None):
        mb_locs, mb_confs = self.model(imgs)
        loc_loss, conf_loss = multibox_loss(
            mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, self.k, comm=self.comm,
            check=self.check, n_positive=n_positive)
        loss = loc_loss * self.alpha + conf_loss
        chainer.reporter.report(
            {"loss": loss, "loss/loc": loc_loss, "loss/conf": conf_loss}, self)
        return loss
