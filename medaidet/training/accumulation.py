"""Gradient accumulation (``--accumulate N``): a large batch's gradients with one micro-batch's
activation memory. Each micro-batch's loss is divided by the positive priors of the *whole*
batch (:func:`batch_positives`), so the micro-batch losses add up to the batch's loss.
:mod:`medaidet.extras.scaling` finds the ``N`` that fits."""
from __future__ import annotations

import contextlib
import copy

import numpy as np

import chainer
from chainer import backend
from chainer.dataset import convert
from chainer.training.updaters import StandardUpdater

from medaidet.errors import ConfigError

__all__ = ["AccumulatingUpdater", "batch_positives", "gradient_difference"]


def _labels(data, labels_key):
    """The ``gt_mb_labels`` of one example or of a converted batch (tuple or dict)."""
    if isinstance(data, dict):
        return data["gt_mb_labels" if isinstance(labels_key, int) else labels_key]
    return data[labels_key]


def batch_positives(batch, comm=None, labels_key=2):
    """The normaliser of a whole batch: its positive priors, as the loss counts them, on the
    host from the iterator's examples (labels at ``labels_key``). A ``numpy.int64``, or with a
    ChainerMN ``comm`` averaged over workers as the loss does."""
    labels = [_labels(example, labels_key) for example in batch]
    count = np.int64(sum(int(backend.get_array_module(x).count_nonzero(x > 0)) for x in labels))
    return comm.allreduce_obj(count) / comm.size if comm else count


class AccumulatingUpdater(StandardUpdater):
    """``StandardUpdater`` that feeds each batch in ``accumulate`` micro-batches, their gradients
    added up (the loss takes ``n_positive``, the whole batch's count), one ``optimizer.update()``.

    ``comm``: default the target's; ``labels_key``: where an example holds ``gt_mb_labels``.
    Reports the sum over micro-batches for the ``summed`` keys, the mean for others. Raises a
    ConfigError when ``accumulate`` is not a positive integer or does not divide a batch.
    """

    summed = ("loss", "loss/loc", "loss/conf")

    def __init__(self, iterator, optimizer, converter=convert.concat_examples, device=None,
                 loss_func=None, loss_scale=None, auto_new_epoch=True, accumulate: int = 1,
                 comm=None, labels_key=2, **kwargs):
        if isinstance(accumulate, bool) or not isinstance(accumulate, (int, np.integer)) \
                or accumulate < 1:
            raise ConfigError(f"accumulate={accumulate!r}: expected a positive integer, the "
                              "micro-batches per batch (1: no accumulation)", "accumulation")
        super().__init__(iterator, optimizer, converter=converter, device=device,
                         loss_func=loss_func, loss_scale=loss_scale,
                         auto_new_epoch=auto_new_epoch, **kwargs)
        self.accumulate, self.labels_key = int(accumulate), labels_key
        target = self.loss_func or self._optimizers["main"].target
        self.comm = comm if comm is not None else getattr(target, "comm", None)
        if (batch_size := getattr(self._iterators["main"], "batch_size", None)) is not None:
            self._check_batch_size(batch_size, "the iterator's batch_size")

    def _check_batch_size(self, batch_size, what):
        if batch_size % (n := self.accumulate):
            divisors = ", ".join(str(d) for d in range(1, batch_size + 1) if batch_size % d == 0)
            raise ConfigError(f"{what} is {batch_size}, not a multiple of accumulate={n}: use a "
                              f"multiple of {n} or an accumulate among {divisors} (a short last "
                              "batch: drop it or use repeat=True)", "accumulation")

    def update_core(self):
        if self.accumulate == 1:
            super().update_core()
            return
        iterator, optimizer = self._iterators["main"], self._optimizers["main"]
        batch = iterator.next()
        self._check_batch_size(len(batch), "this batch's size")
        loss_func = self.loss_func or optimizer.target
        n_positive = batch_positives(batch, self.comm, self.labels_key)
        size, observations = len(batch) // self.accumulate, []
        target = optimizer.target
        (target.cleargrads if getattr(optimizer, "_use_cleargrads", True) else target.zerograds)()
        for start in range(0, len(batch), size):
            in_arrays = convert._call_converter(self.converter, batch[start:start + size],
                                                self.input_device)
            labels = _labels(in_arrays, self.labels_key)    # the normaliser beside them
            normaliser = (n_positive if backend.get_array_module(labels) is np else
                          backend.get_device_from_array(labels).send(np.asarray(n_positive)))
            with _reports_into(observation := {}):
                if isinstance(in_arrays, dict):
                    args, kwargs = (), in_arrays
                elif isinstance(in_arrays, tuple):
                    args, kwargs = in_arrays, {}
                else:
                    args, kwargs = (in_arrays,), {}
                loss = loss_func(*args, **kwargs, n_positive=normaliser)
            loss.backward(loss_scale=getattr(optimizer, "_loss_scale", None))
            # the graph (every activation of this micro-batch) dies here, before the next
            del loss, in_arrays, labels, args, kwargs
            observations.append({key: value.array if isinstance(value, chainer.Variable)
                                 else value for key, value in observation.items()})
        self._report(observations)
        optimizer.update()
        if self.auto_new_epoch and iterator.is_new_epoch:
            optimizer.new_epoch(auto=True)

    def _report(self, observations):
        values = {}
        for key in dict.fromkeys(key for observation in observations for key in observation):
            parts = [o[key] for o in observations if key in o]
            total = sum(parts[1:], parts[0])
            if not any(key == name or key.endswith("/" + name) for name in self.summed):
                total = total / len(parts)
            if isinstance(parts[0], chainer.get_array_types()):
                # a Variable of a 0-d array, as the chain reports (NumPy's 0-d math gives scalars)
                total = chainer.Variable(backend.get_array_module(parts[0]).asarray(total))
            values[key] = total
        chainer.reporter.report(values)


def _reports_into(observation):
    """Route reports to ``observation`` while inside (if a reporter is current)."""
    try:
        chainer.reporter.get_current_reporter()
    except IndexError:                          # no reporter: the chain reports nowhere
        return contextlib.nullcontext()
    return chainer.reporter.report_scope(observation)


def gradient_difference(model, samples, accumulate: int) -> float:
    """``||g_micro - g_batch|| / ||g_batch||``: the gradient of ``accumulate`` micro-batches
    against the whole batch's, for ``model`` (a ChainerCV SSD, left unchanged) on encoded
    ``samples`` (notebook 07). Float rounding without batch normalisation (SSD300); not with it
    (the small SSD, like ChainerMN's ranks): each micro-batch has its own statistics."""
    from medaidet.ssd.loss import MultiboxTrainChain

    grads = []
    for n in (1, accumulate):
        chain = MultiboxTrainChain(copy.deepcopy(model))
        optimizer = chainer.optimizers.SGD(lr=0.0).setup(chain)    # the gradient, not a step
        iterator = chainer.iterators.SerialIterator(list(samples), len(samples), shuffle=False)
        AccumulatingUpdater(iterator, optimizer, accumulate=n).update()
        grads.append(np.concatenate([np.asarray(backend.CpuDevice().send(p.grad),
                                                dtype=np.float64).ravel()
                                     for p in chain.params() if p.grad is not None]))
    batch, micro = grads
    return float(np.linalg.norm(micro - batch) / np.linalg.norm(batch))
