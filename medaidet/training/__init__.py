"""Training (notebooks 03 and 06).

* ``config``: :class:`~medaidet.training.config.TrainConfig`, the recipe's settings and profiles;
* ``train``: :func:`~medaidet.training.train.train` and the :class:`~medaidet.training.train.Recipe`
  it builds in ChainerCV's order, with seeding, the non-finite stop, snapshots and metrics;
* ``extensions``: progress, plots, validation; ``iterators``: worker processes for the
  augmentation; ``accumulation``: a batch in micro-batches (gradient accumulation);
  ``memory_fit``: the batch fitted to the device before training.
"""
