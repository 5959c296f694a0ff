"""The course's tools: what sets a machine up for the course and runs it, not what it teaches.

- :mod:`medaidet_tools.stack`: builds and installs the patched chainer 7.8.1 / chainercv
  0.13.1 wheels (and CuPy on a GPU machine). It must run before chainer exists.
- :mod:`medaidet_tools.course`: runs every notebook with papermill (``make run``).

Installed with medaidet (``pip install -e .``), beside it rather than in it: the learner's
package (``medaidet/``) holds what the notebooks teach. The ``medaidet`` command keeps both
as its ``stack`` and ``course`` commands (:mod:`medaidet_tools.cli`).
"""
