"""Taking the trained detector out of Chainer (notebook 09).

* :mod:`medaidet.deploy.export`: ``export_onnx(weights, out)`` writes an ONNX model of a
  trained SSD (needs the chainer stack and ``onnx``: ``pip install medaidet[export]``).
* :mod:`medaidet.deploy.detector`: :class:`~medaidet.deploy.detector.OnnxDetector` runs that
  model with onnxruntime and decodes its detections in NumPy, without chainer
  (``pip install medaidet[deploy]``).
* :mod:`medaidet.deploy.decode`: the decoding (offsets to boxes, per-class NMS, the caps) in
  NumPy, the same steps as ChainerCV's and :mod:`medaidet.ssd.predict`'s.

The exported model takes ``image``, float32 (1, 3, S, S): one image's RGB pixels 0-255
resized to the model's input size S (the mean is subtracted inside), and returns ``locs``
(1, K, 4), the box offsets of the K default boxes, and ``scores`` (1, K, n_fg_class + 1), the
class probabilities (column 0: background), and ``default_boxes`` (K, 4), a constant, for runtimes
that cannot read metadata. What decoding needs (the default boxes, the variances, the class
names, the presets) is stored in the model's metadata too
(:data:`~medaidet.deploy.detector.METADATA_KEY`).

Nothing here imports chainer at import time.
"""
