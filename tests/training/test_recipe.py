"""The Recipe's pieces, built one by one, train the same weights as ``train()``."""
import sys

import numpy as np
import pytest

from conftest import edit_objects, split_ids
from medaidet.errors import ConfigError
from medaidet.ssd.transforms import EncodeTransform, TrainTransform
from medaidet.training import train as recipe
from medaidet.training.config import TrainConfig
from medaidet.training.train import Recipe
from medaidet.training.train import train

TINY = dict(subset=2, batch_size=1, eval_subset=1, eval_batch_size=1, seed=0, n_processes=0,
            pretrained=None, device="cpu", iterations=3)


def _weights(model) -> dict:
    return {name: np.array(param.array) for name, param in model.namedparams()}


def _assert_same_weights(got_model, expected_model):
    expected, got = _weights(expected_model), _weights(got_model)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    return got


def test_build_gives_every_piece_in_order(tmp_path, bccd_root):
    config = TrainConfig.profile("smoke", root=str(bccd_root), out=str(tmp_path), **TINY)
    built = Recipe(config).build(log=lambda *a: None, progress=False)
    assert built.train_chain.model is built.model
    assert built.optimizer.target is built.train_chain
    assert built.updater.get_optimizer("main") is built.optimizer
    assert built.updater.get_iterator("main") is built.iterators.train
    assert built.trainer.updater is built.updater
    assert built.extensions.monitor.total == 3
    assert len(built.data.images) == 2 and len(built.iterators.val.dataset) == 1


@pytest.mark.parametrize("profile, zoom_out, colours", [
    ("full", 4, True),          # SSD's augmentation
    ("cpu", 1, False),          # chosen on val for the small SSD (docs/cpu-detector.md)
])
def test_the_transform_augments_as_the_profile_says(profile, zoom_out, colours):
    r = Recipe(TrainConfig.profile(profile, pretrained=None))
    model = r.model()
    transform = r.transform(model)
    assert isinstance(transform, TrainTransform)
    assert (transform.max_expand_ratio, transform.color_distortion) == (zoom_out, colours)
    plain = Recipe(r.config.replace(augment=False)).transform(model)
    assert isinstance(plain, EncodeTransform)


def test_augmenting_without_opencv_stops_before_anything_is_built(monkeypatch, bccd_root,
                                                                  tmp_path):
    config = TrainConfig.profile("cpu", pretrained=None, root=str(bccd_root),
                                 out=str(tmp_path / "run"))
    monkeypatch.setitem(sys.modules, "cv2", None)       # `import cv2` raises ImportError
    with pytest.raises(ConfigError):
        train(config, progress=False)
    assert not (tmp_path / "run").exists()
    recipe.prepare_run(config.replace(augment=False))   # the encoding alone needs no OpenCV


def test_training_length_in_epochs_or_iterations():
    by_epochs = recipe.Length(TrainConfig(epochs=2.5, batch_size=4), n_images=10)
    assert by_epochs.stop == (2.5, "epoch") and by_epochs.total == 7
    per_rank = recipe.Length(TrainConfig(epochs=2.5, batch_size=4), n_images=5, batch_size=2)
    assert per_rank.total == 7                   # one of two ranks: half the images and batch
    by_iterations = recipe.Length(TrainConfig(iterations=5, batch_size=4), n_images=10)
    assert by_iterations.stop == (5, "iteration") and by_iterations.total == 5


def test_one_process_recipe():
    r = Recipe(TrainConfig.profile("smoke", device="cpu", batch_size=3))
    assert (r.comm, r.batch_size, r.main, str(r.device)) == (None, 3, True, "@numpy")


def _mark_difficult(annotation, obj):
    obj.find("difficult").text = "1"


def test_training_on_a_split_without_objects_stops_before_any_iteration(bccd_copy, tmp_path,
                                                                         capsys):
    from medaidet.cli import main
    root = bccd_copy()
    edit_objects(root, split_ids(root, "train"))
    out = tmp_path / "run"
    assert main(["train", "--profile", "smoke", "--root", str(root), "--out", str(out),
                 "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("medaidet: error: ")
    assert f"{root}/ImageSets/Main/train.txt" in line            # the list to check
    assert list(out.iterdir()) == []


def _zero_width(annotation, obj):           # the loader drops the box
    obj.find("bndbox/xmax").text = obj.find("bndbox/xmin").text


@pytest.mark.parametrize("change", [_mark_difficult, _zero_width])
def test_a_split_whose_objects_are_all_dropped_or_difficult_has_nothing_to_learn(
        change, bccd_copy):
    import warnings
    from medaidet.data.bccd import AnnotationWarning, BCCDDataset
    root = bccd_copy()
    edit_objects(root, split_ids(root, "train"), change)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnnotationWarning)
        dataset = BCCDDataset(root, "train")
    with pytest.raises(recipe.ConfigError) as info:
        recipe.check_objects(dataset, dataset, TrainConfig(root=str(root)))
    assert info.value.kind == "nothing_to_learn"


def test_images_without_objects_are_fine_when_the_split_has_some(bccd_copy, monkeypatch):
    """Background-only images are legitimate; the check never decodes an image."""
    from medaidet.data import bccd
    from medaidet.data.bccd import BCCDDataset

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded")
    monkeypatch.setattr(bccd, "decode_image", no_decoding)
    root = bccd_copy()
    edit_objects(root, split_ids(root, "train")[:-1])
    dataset = BCCDDataset(root, "train")
    config = TrainConfig(root=str(root))
    assert recipe.check_objects(dataset, dataset, config) is None
    # but the first images alone (subset) have nothing to learn
    config = TrainConfig(root=str(root), subset=2)
    with pytest.raises(recipe.ConfigError) as info:
        recipe.check_objects(dataset, dataset.slice[:2], config)
    assert info.value.kind == "nothing_to_learn"


def _notebook_cell(cell_id: str) -> str:
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "notebooks" / "03_training.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "".join(next(c["source"] for c in cells if c.get("id") == cell_id))


@pytest.mark.slow(seconds=35)
def test_notebook_03_recipe_written_out_trains_what_train_trains(tmp_path, bccd_root):
    """With SSD's augmentation (the full profile's; the cpu profile's is the same code with
    less of it)."""
    from pathlib import Path
    build, run = _notebook_cell("recipe-build"), _notebook_cell("recipe-run")
    config = TrainConfig.profile("smoke", root=str(bccd_root), out=str(tmp_path))
    page = {"profile": "smoke", "root": str(bccd_root), "out": Path(tmp_path), "config": config}
    exec(compile(build, "recipe-build", "exec"), page)
    exec(compile(run, "recipe-run", "exec"), page)
    demo = page["demo"]
    assert page["updater"].iteration == demo.iterations == 2

    by_train = train(demo.replace(out=str(tmp_path / "by-train")), progress=False)
    _assert_same_weights(page["model"], by_train.model)
    log = page["trainer"].get_extension("LogReport").log
    assert by_train.metrics["log"][-1]["main/loss"] == log[-1]["main/loss"]
