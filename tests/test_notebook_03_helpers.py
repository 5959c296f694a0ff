"""Notebook 03's helpers: cell ``c03-aug-record`` sees every augmentation step without changing
it; section 4's lr step at ``ceil(epoch * images / batch)`` is when chainer shifts the rate."""
import math
import random
from pathlib import Path

import nbformat
import numpy as np
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_training.ipynb"


def _helpers() -> dict:
    cell, = (c for c in nbformat.read(str(NOTEBOOK), as_version=4).cells
             if c.get("id") == "c03-aug-record")
    namespace = {}
    exec(cell.source, namespace)
    return namespace


def _sample():
    rng = np.random.RandomState(0)
    img = rng.uniform(0, 255, (3, 48, 64)).astype(np.float32)
    bbox = np.array([[4, 4, 20, 20], [10, 30, 30, 50], [25, 5, 44, 25]], np.float32)
    return img, bbox, np.array([0, 1, 2], np.int32)


@pytest.mark.parametrize("max_expand_ratio, color_distortion", [(1, False), (4, True)])
def test_the_recorder_sees_every_step_and_changes_nothing(max_expand_ratio, color_distortion):
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.transforms import TrainTransform

    helpers = _helpers()
    transform = TrainTransform.for_model(build_ssd("ssd_small", None),
                                         max_expand_ratio=max_expand_ratio,
                                         color_distortion=color_distortion)
    img, bbox, label = _sample()
    seen = set()
    for seed in range(20):
        random.seed(seed)
        plain = transform.augment(img, bbox, label)
        random.seed(seed)
        recorded, chosen = helpers["augment_and_record"](transform, img, bbox, label)
        for a, b in zip(plain, recorded):
            np.testing.assert_array_equal(a, b)
        assert {"crop", "flip"} <= set(chosen) <= {"zoom-out", "crop", "flip"}
        seen |= set(chosen)
        title = helpers["what_augmentation_did"](chosen, img.shape, transform).replace("\n", " ")
        assert ("not flipped" in title) != chosen["flip"]["x_flip"]
        assert ("colours jittered" in title) == color_distortion
    assert "zoom-out" in seen      # the coin came up at least once in 20 draws


def test_a_learning_rate_step_applies_after_the_iteration_notebook_03_marks():
    import chainer
    from chainer import training
    from chainer.training import extensions, triggers

    images, batch, step = 10, 4, 3               # epoch 3 ends inside iteration 8 (7.5)
    model = chainer.links.Linear(1, 1)
    optimizer = chainer.optimizers.SGD(lr=1.0)
    optimizer.setup(model)
    data = [(np.ones(1, np.float32), np.ones(1, np.float32))] * images
    iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)

    def loss(x, t):
        return chainer.functions.mean_squared_error(model(x), t)

    updater = training.updaters.StandardUpdater(iterator, optimizer, loss_func=loss)
    trainer = training.Trainer(updater, (12, "iteration"))
    trainer.extend(extensions.ExponentialShift("lr", 0.1, init=1.0),
                   trigger=triggers.ManualScheduleTrigger([step], "epoch"))
    rates = {}
    trainer.extend(lambda t: rates.__setitem__(t.updater.iteration, optimizer.lr),
                   trigger=(1, "iteration"), priority=-1000)   # after the shift
    trainer.run()
    marked = math.ceil(step * images / batch)
    assert rates[marked - 1] == 1.0 and rates[marked] == pytest.approx(0.1)
