"""Divergence: stop at the first nan or inf, before a snapshot of that state is written.

:class:`StopOnNonFinite` is an optimizer hook: before every update it checks the loss and
the gradients, after it the weights. A nan or inf stops training with
a :class:`~medaidet.errors.DivergedError` (kind ``"training"``) naming the iteration; the
last trainer snapshot is left as it was, with finite weights, and the error says where it is.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import chainer
from chainer import backend

from medaidet.errors import DivergedError
from medaidet.ssd.precision import skipped_update
from medaidet.training.snapshot import snapshot_iteration

__all__ = ["StopOnNonFinite", "stop_on_divergence"]


class StopOnNonFinite:
    """Optimizer hook that stops training at the first nan or inf.

    ``timing='pre'`` (after backward, before the update rule): this iteration's loss
    (``main/loss`` as the train chain reported it) and every gradient. ``timing='post'``
    (after the update): every parameter, so a step that overflows the weights is caught in
    the iteration that made it, before the trainer writes a snapshot of it. One host
    synchronisation each: the per-array checks travel together. In ``mixed16`` a step whose
    scaled gradients overflowed is skipped by the optimizer (dynamic loss scaling), not
    stopped here.
    """

    call_for_each_param = False

    def __init__(self, timing: str = "pre", loss_key: str = "main/loss"):
        if timing not in ("pre", "post"):
            raise ValueError(f"timing must be 'pre' or 'post', got {timing!r}")
        self.timing = timing
        self.name = f"StopOnNonFinite_{timing}"
        self.loss_key = loss_key

    def __call__(self, optimizer):
        if self.timing == "pre" and skipped_update(optimizer):
            return      # mixed16: scaled gradients overflowed; the step is skipped, not diverged
        if self.timing == "pre":
            try:
                observation = chainer.reporter.get_current_reporter().observation
            except IndexError:                      # no reporter: outside a trainer
                observation = {}
            loss = observation.get(self.loss_key)
            if loss is not None:
                value = float(getattr(loss, "array", loss))
                if not math.isfinite(value):
                    raise DivergedError(f"the loss is {value}", "training")
            arrays = [(name, p.grad) for name, p in optimizer.target.namedparams()]
            what = "gradient"
        else:
            arrays = [(name, p.array) for name, p in optimizer.target.namedparams()]
            what = "weight array"
        bad = _non_finite([(n, a) for n, a in arrays if a is not None])
        if bad:
            after = " after this iteration's update" if self.timing == "post" else ""
            raise DivergedError(f"{len(bad)} {what}(s) hold nan or inf{after}, first {bad[0]}",
                                "training")


def _non_finite(named_arrays) -> list:
    """Names of the arrays holding a nan or inf (one transfer to the host)."""
    if not named_arrays:
        return []
    xp = backend.get_array_module(named_arrays[0][1])
    finite = backend.CpuDevice().send(xp.stack([xp.isfinite(a).all() for _, a in named_arrays]))
    return [name for (name, _), ok in zip(named_arrays, finite) if not ok]


@contextlib.contextmanager
def stop_on_divergence(updater, snapshot: Path):
    """Around ``trainer.run()``: a nan or inf met by :class:`StopOnNonFinite` or by the
    safe loss (a :class:`~medaidet.errors.DivergedError` without an iteration) becomes one
    naming the iteration and the snapshot kept."""
    try:
        yield
    except DivergedError as exc:
        if exc.iteration is not None:
            raise
        cause = (str(exc) if exc.kind == "training" else
                 f"the network's outputs hold nan or inf ({exc})")
        raise _diverged_error(cause, updater.iteration + 1, snapshot) from exc


def _diverged_error(cause, iteration: int, snapshot: Path) -> DivergedError:
    snap_iteration = snapshot_iteration(snapshot) if snapshot.is_file() else None
    if snap_iteration is None:
        kept = (f"no trainer snapshot had been written yet ({snapshot} does not exist): "
                "set snapshot_interval to keep one")
        snapshot_arg = None
    else:
        kept = (f"the last trainer snapshot, {snapshot} (iteration {snap_iteration}), is "
                "intact")
        snapshot_arg = snapshot
    return DivergedError(
        f"training diverged at iteration {iteration}: {cause}. Training stopped there: "
        f"model.npz was not written and no snapshot of this state was taken; {kept}. "
        "Common causes: a learning rate too high for this batch size (lower lr, or warm "
        "up), or a bad sample (medaidet data validate). Start again with a lower lr, or "
        "resume from the snapshot once the cause is fixed.", "training",
        iteration=iteration, snapshot=snapshot_arg, snapshot_iteration=snap_iteration)
