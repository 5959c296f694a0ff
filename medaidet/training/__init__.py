"""Training (notebooks 03 and 06): the course recipe, and a whole run.

* ``config``: :class:`~medaidet.training.config.TrainConfig`, the recipe's settings and profiles;
* ``recipe``: :class:`~medaidet.training.recipe.Recipe`, one method per piece, in ChainerCV's
  order (model, train chain, datasets, iterators, optimizer, updater, trainer, extensions);
* ``run``: :func:`~medaidet.training.run.train`, the recipe plus checks, seeding,
  snapshots, metrics and plots;
* ``accumulation``: a batch in micro-batches (gradient accumulation); ``iterators``: worker processes for the
  augmentation; ``divergence``: stop at the first nan or inf; ``snapshot``: snapshots with
  the random states, and resume; ``extensions``: progress, plots, validation;
  ``result``: :class:`~medaidet.training.result.TrainResult`; ``seeding``: every random
  number generator seeded.
"""
