"""Training (notebooks 03 and 06): ``config`` (:class:`TrainConfig`), ``train`` (:func:`train`
and its :class:`Recipe`), ``extensions``, ``iterators``, ``accumulation``, ``memory``.
"""
