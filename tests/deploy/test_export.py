"""medaidet export: an ONNX model whose detections are chainer's, on every test image."""
import json
import subprocess
import sys
import shutil

import chainer
import numpy as np
import onnx
import pytest
from chainercv.evaluations import eval_detection_voc
from PIL import Image

from medaidet.cli import main
from medaidet.data import BCCD_LABEL_NAMES
from medaidet.data.bccd import BCCDDataset
from medaidet.errors import ConfigError, DataError, WeightsError
from medaidet.evaluation.evaluate import load_model, predict_split
from medaidet.extras import deploy as onnx_compat
from medaidet.extras.deploy import (METADATA_KEY, OnnxDetector, compare_detections, export_onnx,
                                    read_rgb)
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import materialize, save_weights, shipped_weights

from conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "ssd_small.onnx"
    return export_onnx(shipped_weights("ssd_small"), out)


@pytest.fixture(scope="module")
def test_split(bccd_root):
    dataset = BCCDDataset(bccd_root, "test", use_difficult=True, return_difficult=True)
    return dataset, [dataset[i][0] for i in range(len(dataset))]


def raw_difference(detector, model, images):
    """The largest difference of the graph's outputs from chainer's (locs, softmax scores)."""
    worst = 0.0
    for image in images:
        locs, scores, _ = detector.raw([image])
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            mb_locs, mb_confs = model(model.xp.asarray(model._prepare(image))[None])
        worst = max(worst, np.abs(locs - mb_locs.array).max(),
                    np.abs(scores - chainer.functions.softmax(mb_confs, axis=2).array).max())
    return worst


def test_onnx_gets_its_mapping_module_back():
    onnx_compat.apply_onnx_compat()
    from onnx import TensorProto
    from onnx.mapping import (NP_TYPE_TO_TENSOR_TYPE, STORAGE_TENSOR_TYPE_TO_FIELD,
                              TENSOR_TYPE_TO_NP_TYPE)

    assert NP_TYPE_TO_TENSOR_TYPE[np.dtype("float32")] == TensorProto.FLOAT
    assert NP_TYPE_TO_TENSOR_TYPE[np.dtype("int64")] == TensorProto.INT64
    assert TENSOR_TYPE_TO_NP_TYPE[TensorProto.FLOAT16] == np.dtype("float16")
    assert STORAGE_TENSOR_TYPE_TO_FIELD[TensorProto.FLOAT] == "float_data"
    # float16 is stored in int32_data: the old table did not name a field for it
    assert TensorProto.FLOAT16 not in STORAGE_TENSOR_TYPE_TO_FIELD
    assert onnx_compat.apply_onnx_compat() is False


def test_the_graph_is_valid_and_says_what_it_holds(exported):
    model = onnx.load(str(exported.path))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["image"]    # the weights are constants
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [1, 3, 300, 300]
    assert [o.name for o in model.graph.output] == ["locs", "scores", "default_boxes"]
    assert model.opset_import[0].version == exported.opset == 11
    assert model.ir_version == 6     # the file format of opset 11 (onnxruntime-web reads it)
    meta = json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])
    assert meta["model"] == exported.model == "ssd_small" and meta["insize"] == 300
    assert meta["label_names"] == list(BCCD_LABEL_NAMES)
    assert np.asarray(meta["default_boxes"]).shape == (exported.n_default_boxes, 4) == (8732, 4)
    assert meta["variances"] == [0.1, 0.2]
    import onnxruntime
    session = onnxruntime.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    constant, = session.run(["default_boxes"], {"image": np.zeros((1, 3, 300, 300), np.float32)})
    np.testing.assert_allclose(constant, meta["default_boxes"], rtol=1e-6)
    assert str(exported) == (f"{exported.path}: ssd_small, input 3x300x300, 8732 default boxes, "
                             "ONNX opset 11")


@pytest.mark.slow(seconds=18)
def test_the_same_detections_as_chainer_on_every_test_image(exported, test_split):
    """Every detection paired with chainer's, or a score tie (compare_detections)."""
    dataset, images = test_split
    model = load_model(shipped_weights("ssd_small"))
    theirs = predict_split(model, dataset, progress=False)       # the 'evaluate' preset
    detector = OnnxDetector(exported.path)
    assert (detector.score_thresh, detector.nms_thresh) == (0.01, 0.45)   # predict_split's
    assert raw_difference(detector, model, images[:8]) < 1e-4
    ours = [[], [], []]
    for start in range(0, len(images), 8):
        for part, found in zip(ours, detector.predict(images[start:start + 8])):
            part.extend(found)
    parity = compare_detections(ours, (theirs.pred_bboxes, theirs.pred_labels,
                                       theirs.pred_scores), detector.nms_thresh, names=dataset.ids)
    assert parity.same, str(parity)     # every detection paired, the same counts (score >= 0.5)
    assert parity.n_same + parity.n_ties == len(np.hstack(ours[1])) > 5000
    assert parity.box_difference <= 0.5 and parity.score_difference <= 1e-4
    gt = (theirs.gt_bboxes, theirs.gt_labels, theirs.gt_difficults)
    ours_map = eval_detection_voc(*ours, *gt)["map"]
    theirs_map = eval_detection_voc(theirs.pred_bboxes, theirs.pred_labels, theirs.pred_scores,
                                    *gt)["map"]
    assert round(ours_map, 3) == round(theirs_map, 3) and ours_map > 0.85


@pytest.mark.slow(seconds=20)
def test_ssd300_exports_with_the_same_outputs(tmp_path, test_split):
    chainer.global_config.dtype = np.float32
    np.random.seed(0)
    model = materialize(build_ssd("ssd300", None, n_fg_class=3))
    weights = tmp_path / "ssd300.npz"
    save_weights(model, weights)
    exported = export_onnx(weights, tmp_path / "ssd300.onnx")
    assert exported.model == "ssd300" and exported.n_default_boxes == 8732
    assert raw_difference(OnnxDetector(exported.path), model, test_split[1][:1]) < 1e-4


def test_mistakes_are_named_before_any_work(tmp_path):
    weights = shipped_weights("ssd_small")
    for opset in (13, 8, 7):    # 7 and 8 would fail in onnx's checker after the work
        with pytest.raises(ConfigError) as info:
            export_onnx(weights, tmp_path / "m.onnx", opset=opset)
        assert str(info.value).startswith(f"opset: {opset}:")
    with pytest.raises(WeightsError) as info:
        export_onnx(tmp_path / "none.npz", tmp_path / "m.onnx")
    assert (info.value.kind, info.value.path) == ("missing", tmp_path / "none.npz")
    with pytest.raises(IsADirectoryError) as error:
        export_onnx(weights, tmp_path)
    assert error.value.filename == str(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OSError) as error:
        export_onnx(weights, blocker / "m.onnx")
    assert str(blocker) in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_detector_refuses_what_it_cannot_use(tmp_path, exported):
    with pytest.raises(WeightsError) as info:
        OnnxDetector(tmp_path / "none.onnx")
    assert (info.value.kind, info.value.path) == ("missing", tmp_path / "none.onnx")
    other = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
        opset_imports=[onnx.helper.make_opsetid("", 11)])
    onnx.save(other, str(tmp_path / "other.onnx"))
    (tmp_path / "text.onnx").write_text("not a model")
    for name in ("other.onnx", "text.onnx"):      # a model of another graph, not a model
        with pytest.raises(WeightsError) as info:
            OnnxDetector(tmp_path / name)
        assert (info.value.kind, info.value.path) == ("file", tmp_path / name)
    detector = OnnxDetector(exported.path)
    for score_thresh in (-1, float("nan"), 2, True, "x"):
        with pytest.raises(ConfigError) as info:
            detector.count(np.zeros((3, 8, 8)), score_thresh=score_thresh)
        assert str(info.value).startswith("score_thresh:")


BLOCK_CHAINER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('chainer', 'chainercv', 'chainermn', 'cupy', 'onnx_chainer'):
            raise ImportError('not installed (blocked by the test): ' + name)
sys.meta_path.insert(0, Block())
from medaidet.cli import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if m.split('.')[0] in ('chainer', 'chainercv')]
sys.exit(code)
"""


def test_count_image_runs_without_chainer(tmp_path, exported, bccd_root):
    images = sorted((bccd_root / "JPEGImages").glob("*.jpg"))[:2]
    done = subprocess.run([sys.executable, "-c", BLOCK_CHAINER, "count-image", *map(str, images),
                           "--model", str(exported.path), "--out", str(tmp_path / "out"),
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    detector = OnnxDetector(exported.path)
    for result, image in zip(printed, images):
        assert result["counts"] == detector.count(read_rgb(image), score_thresh=0.5)
        assert sum(result["counts"].values()) == len(result["detections"]) > 0
        written = json.loads((tmp_path / "out" / f"{image.stem}.json").read_text())
        assert written == result
        with Image.open(tmp_path / "out" / f"{image.stem}.png") as drawn:
            assert drawn.size == (640, 480)


def test_export_never_overwrites_its_input_and_out_dir_means_a_folder(tmp_path):
    weights = tmp_path / "model.npz"
    shutil.copy(shipped_weights("ssd_small"), weights)
    before = weights.read_bytes()
    with pytest.raises(ConfigError) as info:
        export_onnx(weights, weights)
    assert info.value.kind == "input"
    assert weights.read_bytes() == before
    assert main(["export", str(weights), "--out", str(tmp_path / "onnx") + "/"]) == 0
    assert (tmp_path / "onnx" / "model.onnx").is_file()
    assert weights.read_bytes() == before


def test_count_image_never_replaces_an_image_and_refuses_two_with_one_name(tmp_path, exported,
                                                                          bccd_root):
    def count_image(*args):
        return subprocess.run([sys.executable, "-m", "medaidet", "count-image", "--model",
                               str(exported.path), *map(str, args)], capture_output=True,
                              text=True, cwd=REPO, timeout=120)

    image = bccd_root / "JPEGImages" / "BloodImage_00000.jpg"
    folder = tmp_path / "smears"
    folder.mkdir()
    png = folder / "smear.png"
    with Image.open(image) as img:
        img.save(png)
    before = png.read_bytes()
    done = count_image(png, "--out", folder)            # its drawing would be smear.png
    assert done.returncode == 2 and "is also an input" in done.stderr
    assert png.read_bytes() == before and not (folder / "smear.json").exists()
    (tmp_path / "b").mkdir()
    shutil.copy(png, tmp_path / "b" / "smear.png")
    done = count_image(png, tmp_path / "b" / "smear.png", "--out", tmp_path / "out")
    assert done.returncode == 2 and "smear.json" in done.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "results").write_text("mine")
    done = count_image(image, "--out", tmp_path / "results")
    assert done.returncode == 2 and (tmp_path / "results").read_text() == "mine"
    done = count_image(image, "--json")
    assert done.returncode == 0 and isinstance(json.loads(done.stdout), list)   # one image too


def test_read_rgb_reads_by_the_loaders_rule(tmp_path, exported, bccd_root):
    """16-bit counts as its 8-bit copy (not white); transparent and huge images are refused."""
    detector = OnnxDetector(exported.path)
    with Image.open(bccd_root / "JPEGImages" / "BloodImage_00000.jpg") as img:
        gray = img.convert("L")
    gray.save(tmp_path / "8bit.png")
    sixteen = np.asarray(gray, dtype=np.uint16) * 257
    Image.fromarray(sixteen).save(tmp_path / "16bit.png")
    with Image.open(tmp_path / "16bit.png") as img:
        assert img.mode.startswith("I")
    eight = read_rgb(tmp_path / "8bit.png")
    np.testing.assert_array_equal(read_rgb(tmp_path / "16bit.png"), eight)
    assert detector.count(eight) == detector.count(read_rgb(tmp_path / "16bit.png"))
    assert sum(detector.count(eight).values()) > 0
    rgba = gray.convert("RGBA")
    rgba.putpixel((0, 0), (0, 0, 0, 0))
    rgba.save(tmp_path / "transparent.png")
    Image.new("1", (15000, 15000)).save(tmp_path / "huge.png")
    for name in ("transparent.png", "huge.png"):
        with pytest.raises(DataError) as info:
            read_rgb(tmp_path / name)
        assert (info.value.kind, info.value.path) == ("image", tmp_path / name)


def _tampered(exported, tmp_path, name, change):
    """A copy of the exported model whose metadata (a dict) or graph ``change`` alters."""
    model = onnx.load(str(exported.path))
    props = {p.key: p.value for p in model.metadata_props}
    meta = json.loads(props[METADATA_KEY])
    text = change(meta, model)
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, {METADATA_KEY: text if isinstance(text, str)
                                        else json.dumps(meta)})
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _rename_input(model):
    model.graph.input[0].name = "pixels"
    for node in model.graph.node:
        node.input[:] = ["pixels" if i == "image" else i for i in node.input]


TAMPERED = {
    "not-json": lambda m, g: "{not json",
    "no-insize": lambda m, g: m.pop("insize"),
    "insize-0": lambda m, g: m.update(insize=0),
    "100-boxes": lambda m, g: m.update(default_boxes=m["default_boxes"][:100]),
    "one-name": lambda m, g: m.update(label_names=["rbc"]),
    "five-names": lambda m, g: m.update(label_names=list("abcde")),
    "nan-boxes": lambda m, g: m["default_boxes"][0].__setitem__(0, float("nan")),
    "no-image": lambda m, g: _rename_input(g),
    "bad-preset": lambda m, g: m["presets"]["evaluate"].update(score_thresh=3),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_model_file_is_named_not_a_traceback_or_a_wrong_count(case, exported,
                                                                         tmp_path):
    path = _tampered(exported, tmp_path, case, TAMPERED[case])
    with pytest.raises(WeightsError) as info:
        OnnxDetector(path)
    assert (info.value.kind, info.value.path) == ("file", path)


def test_the_detectors_arguments_follow_the_predictors_rules(exported):
    detector = OnnxDetector(exported.path)
    calls = [(f, lambda f=f, v=v: OnnxDetector(exported.path, **{f: v})) for f, v in (
        ("score_thresh", float("nan")), ("score_thresh", 2), ("score_thresh", -1),
        ("nms_thresh", -1), ("nms_thresh", float("nan")), ("threads", "many"))]
    calls += [("path", lambda p=p: OnnxDetector(p)) for p in (None, 3, b"model.onnx")]
    calls += [(f, lambda i=i: detector.predict(i)) for i, f in (
        (None, "images"), (np.zeros((3, 8, 8)), "images"), ([np.zeros((3, 0, 8))], "images[0]"),
        ([np.zeros((480, 640, 3))], "images[0]"), ([np.full((3, 8, 8), 0.5)], "images[0]"),
        ([np.full((3, 8, 8), 1e30)], "images[0]"),
        ([np.zeros((3, 8, 8)), np.full((3, 8, 8), np.nan)], "images[1]"))]
    for field, call in calls:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value).split()[0].rstrip(":") == field, str(info.value)


@pytest.mark.slow(seconds=2)
@pytest.mark.parametrize("opset", [9, 10])
def test_every_offered_opset_exports_a_model_that_detects_the_same(opset, tmp_path, exported,
                                                                    bccd_root):
    older = export_onnx(shipped_weights("ssd_small"), tmp_path / f"m{opset}.onnx", opset=opset)
    assert onnx.load(str(older.path)).opset_import[0].version == opset
    image = read_rgb(bccd_root / "JPEGImages" / "BloodImage_00000.jpg")
    assert OnnxDetector(older.path).count(image) == OnnxDetector(exported.path).count(image)
