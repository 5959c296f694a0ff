"""Scaling (notebooks 07 and 08): the batch size that fits in memory, and launching a
ChainerMN run on several processes. Built on the training recipe (:mod:`medaidet.training`)."""
