"""Stand-ins for an SSD and a ChainerMN communicator, for the loss and training-chain tests."""
import chainer
import chainer.functions as F
import numpy as np


class StubModel(chainer.Link):
    """``model(imgs)`` -> learnable (B, K, 4) locations and (B, K, n_class) scores, each scaled
    by its image's mean pixel (so micro-batches of different images differ)."""

    def __init__(self, n_prior=12, n_class=4):
        super().__init__()
        rng = np.random.default_rng(0)
        with self.init_scope():
            self.loc = chainer.Parameter(rng.normal(size=(n_prior, 4)).astype(np.float32))
            self.conf = chainer.Parameter(rng.normal(size=(n_prior, n_class)).astype(np.float32))

    def forward(self, imgs):
        scale = F.reshape(F.mean(imgs, axis=(1, 2, 3)), (-1, 1, 1))
        b = len(imgs)
        return (F.broadcast_to(self.loc, (b,) + self.loc.shape) * scale,
                F.broadcast_to(self.conf, (b,) + self.conf.shape) * scale)


class FakeComm:
    """A communicator's ``size`` and ``allreduce_obj``: the other workers together add
    ``others``; ``received`` records what each call was given."""

    def __init__(self, size, others):
        self.size, self.others, self.received = size, others, []

    def allreduce_obj(self, obj):
        self.received.append(obj)
        return obj + self.others
