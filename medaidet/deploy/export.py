"""An ONNX model of a trained SSD (``medaidet export``; notebook 09).

:func:`export_onnx` reads the weights as ``evaluate`` does (the model is the one the file was
saved from), wraps the SSD so the graph takes the image's pixels and gives what decoding needs
(the mean subtracted inside; ``locs`` and the softmaxed ``scores``), traces it with the
``onnx_chainer`` of the chainer build (:mod:`medaidet.deploy.onnx_compat` makes it work with
today's ``onnx``), stores the default boxes, variances, class names and presets in the
model's metadata, checks the graph with ``onnx.checker`` and writes it atomically.
"""
from __future__ import annotations

import errno
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medaidet.deploy.detector import METADATA_KEY
from medaidet.errors import ConfigError

__all__ = ["export_onnx", "ExportedModel", "OPSETS", "DEFAULT_OPSET",
           "METADATA_KEY"]

#: The opsets offered (9 to 11); 11 is the default (onnxruntime and onnxruntime-web run it).
#: onnx_chainer also writes 7 and 8, but their file format (IR 3) wants every weight listed as
#: a graph input a caller could override, which this exporter does not write.
OPSETS = range(9, 12)
DEFAULT_OPSET = 11


@dataclass(frozen=True)
class ExportedModel:
    """What :func:`export_onnx` wrote: ``path``, the model's name, input size and opset."""

    path: Path
    model: str
    insize: int
    opset: int
    n_default_boxes: int

    def __str__(self) -> str:
        return (f"{self.path}: {self.model}, input 3x{self.insize}x{self.insize}, "
                f"{self.n_default_boxes} default boxes, ONNX opset {self.opset}")


def _check_opset(opset) -> int:
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)) or opset not in OPSETS:
        raise ConfigError(
            f"opset: {opset!r}: medaidet exports ONNX opsets {OPSETS.start} to "
            f"{OPSETS.stop - 1}; use {DEFAULT_OPSET} (onnxruntime and onnxruntime-web run it)")
    return int(opset)


def _pixels_in(ssd):
    """A chain from one image's pixels (1, 3, S, S), 0-255, to ``(locs, scores)``."""
    import chainer
    import chainer.functions as F

    class PixelsIn(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.ssd = ssd
            self.mean = np.asarray(ssd.mean, dtype=np.float32)[None]    # (1, 3, 1, 1)

        def forward(self, image):
            locs, confs = self.ssd(image - self.mean)
            return locs, F.softmax(confs, axis=2)

    return PixelsIn()


def decoding_metadata(model) -> dict:
    """What turns the model's outputs into detections, for the model's metadata."""
    from medaidet.data import BCCD_LABEL_NAMES, CLASS_COLORS
    from medaidet.evaluation.protocol import COURSE_SCORE_THRESH, EVALUATE_SCORE_THRESH
    from medaidet.ssd.predict import DEFAULT_KEEP_TOP_K, DEFAULT_TOP_K

    coder = model.coder
    return {
        "model": model.name, "insize": int(model.insize),
        "label_names": list(BCCD_LABEL_NAMES),
        "class_colors": [CLASS_COLORS[name] for name in BCCD_LABEL_NAMES],
        "default_boxes": np.asarray(coder._default_bbox, dtype=np.float64).tolist(),
        "variances": [float(v) for v in coder._variance],
        "presets": {"evaluate": {"score_thresh": EVALUATE_SCORE_THRESH,
                                 "nms_thresh": model.nms_thresh},
                    "visualize": {"score_thresh": COURSE_SCORE_THRESH,
                                  "nms_thresh": model.nms_thresh}},
        "top_k": DEFAULT_TOP_K, "keep_top_k": DEFAULT_KEEP_TOP_K,
        "box_order": "y_min, x_min, y_max, x_max",
    }


def _add_default_boxes_output(graph, default_boxes) -> None:
    """A third output, ``default_boxes`` (K, 4) ``(center y, center x, height, width)`` in the
    input's pixels: a constant, for runtimes that cannot read the metadata (a browser)."""
    import onnx
    from onnx import numpy_helper

    boxes = np.asarray(default_boxes, dtype=np.float32)
    graph.graph.initializer.append(numpy_helper.from_array(boxes, "default_boxes_value"))
    graph.graph.node.append(onnx.helper.make_node("Identity", ["default_boxes_value"],
                                                  ["default_boxes"]))
    graph.graph.output.append(onnx.helper.make_tensor_value_info(
        "default_boxes", onnx.TensorProto.FLOAT, list(boxes.shape)))


def _writable(out: Path) -> Path:
    """``out``, once its folder exists and can be written: an ``OSError`` naming it if not."""
    if out.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give the .onnx file to write",
                                str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PermissionError(errno.EACCES, "cannot be written here (permission denied); "
                              "choose another --out", str(out))
    return out


def export_onnx(weights, out, opset: int = DEFAULT_OPSET, model_name=None) -> ExportedModel:
    """Write the SSD trained into ``weights`` (a model-only ``.npz``) as ONNX to ``out``.

    Raises :class:`~medaidet.errors.ConfigError` (``opset`` outside 9-11),
    a ``"missing"`` WeightsError (no file at
    ``weights``) and the weight loader's named errors (a file that is not the weights of an
    SSD of this course), and ``OSError`` naming ``out`` when it cannot be written; all
    before anything is written. A failed write leaves no partial file.
    """
    import chainer
    import onnx

    from medaidet.deploy import onnx_compat
    from medaidet.evaluation.predictions import load_model
    from medaidet.files import atomic_file, check_output

    opset = _check_opset(opset)
    out = _writable(Path(os.fspath(out)))
    check_output(out, inputs=(weights,))
    model = load_model(weights, model_name=model_name, device="cpu")
    metadata = decoding_metadata(model)   # now: wrapped, the link is renamed "ssd"
    onnx_compat.apply()
    import onnx_chainer

    x = np.zeros((1, 3, model.insize, model.insize), dtype=np.float32)
    with chainer.using_config("train", False):
        graph = onnx_chainer.export(_pixels_in(model), x, opset_version=opset,
                                    input_names=["image"], output_names=["locs", "scores"])
    # the weights are constants (initializers), not inputs a caller could override
    constants = {t.name for t in graph.graph.initializer}
    inputs = [i for i in graph.graph.input if i.name not in constants]
    del graph.graph.input[:]
    graph.graph.input.extend(inputs)
    _add_default_boxes_output(graph, metadata["default_boxes"])
    # the oldest file format that holds this opset, not onnx's newest: older runtimes (a
    # browser's onnxruntime-web lags onnxruntime) read it
    graph.ir_version = onnx.helper.find_min_ir_version_for(list(graph.opset_import))
    onnx.helper.set_model_props(graph, {METADATA_KEY: json.dumps(metadata)})
    graph.doc_string = (f"medaidet {metadata['model']} for BCCD (rbc, wbc, platelets): image "
                        f"(1, 3, {model.insize}, {model.insize}) RGB 0-255 -> locs, scores")
    onnx.checker.check_model(graph)
    data = io.BytesIO()
    onnx.save(graph, data)
    with atomic_file(out, inputs=(weights,)) as f:
        f.write(data.getvalue())
    return ExportedModel(out, metadata["model"], int(model.insize), opset,
                         len(model.coder._default_bbox))
