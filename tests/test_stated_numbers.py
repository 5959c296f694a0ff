"""The numbers the course's text states, next to the data, configs and models they describe.
A reworded sentence fails its pattern here: update the pattern, keep the comparison."""
import inspect
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _text(name: str) -> str:
    """README.md, or the markdown of notebooks/<name>*.ipynb, one cell per paragraph."""
    if name == "README.md":
        return (REPO / name).read_text(encoding="utf-8")
    path, = (REPO / "notebooks").glob(f"{name}*.ipynb")
    nb = nbformat.read(str(path), as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def stated(name: str, pattern: str) -> tuple:
    """``pattern``'s groups (numbers as int/float) in its one match; whitespace matches any."""
    regex = re.sub(r"\\ |\s+", r"\\s+", pattern)
    found = list(re.finditer(regex, _text(name)))
    assert len(found) == 1, f"{name}: {len(found)} matches of {pattern!r} (reworded? update it)"
    return tuple(_number(g) for g in found[0].groups())


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


def _split_sizes(root: Path) -> dict:
    return {split: len((root / "ImageSets" / "Main" / f"{split}.txt").read_text().split())
            for split in ("train", "val", "test")}


def test_dataset_sizes(bccd_root):
    from PIL import Image

    n_images, width, height, n_train, n_val, n_test = stated(
        "00", r"\((\d+) images of (\d+)×(\d+), (\d+) train / (\d+) val / (\d+) test\)")
    sizes = _split_sizes(bccd_root)
    images = sorted((bccd_root / "JPEGImages").glob("*.jpg"))
    assert (n_train, n_val, n_test) == (sizes["train"], sizes["val"], sizes["test"])
    assert n_images == len(images) == sum(sizes.values())
    assert Image.open(images[0]).size == (width, height)
    assert stated("03", r"train split \((\d+)\s+images\)") == (sizes["train"],)
    assert stated("03", r"on the \*\*val\*\* split: (\d+) images") == (sizes["val"],)


def test_training_profiles():
    from medaidet.training.config import TrainConfig

    cpu, cpu_long, full, smoke = (TrainConfig.profile(p)
                                  for p in ("cpu", "cpu-long", "full", "smoke"))
    batch, epochs = stated("03", r"in batches of (\d+) for (\d+) epochs")
    assert (batch, epochs) == (cpu.batch_size, cpu.epochs)
    assert cpu_long.epochs == 3 * cpu.epochs and "three times as long" in _text("03")
    assert stated("03", r"zoom-out to (\d+)×") == (cpu_long.max_expand_ratio,)
    assert cpu_long.color_distortion and not cpu.color_distortion
    n_train, per_step, iterations = stated(
        "03", r"\((\d+) images in batches of (\d+): about (\d+)\s+iterations\)")
    assert per_step == cpu.batch_size and iterations == n_train // per_step
    assert stated("03", r"\*\*`smoke`\*\* \(CI\): (\d+) iterations on (\d+) images") == (
        smoke.iterations, smoke.subset)
    lr, momentum, decay, batch, epochs, first, second = stated(
        "03", r"MomentumSGD \(lr (\S+), momentum ([\d.]+)\), weight decay (\S+), batch (\d+), "
              r"(\d+) epochs with the learning rate ×0\.1 at epochs (\d+) and (\d+)")
    assert full.optimizer == "momentum_sgd" and full.lr == float(lr)
    assert (momentum, float(decay), batch, epochs) == (full.momentum, full.weight_decay,
                                                       full.batch_size, full.epochs)
    assert (first, second) == tuple(full.lr_steps) and full.lr_gamma == 0.1


def test_default_box_sizes_and_the_small_ssd():
    from medaidet.ssd.model import build_ssd
    from medaidet.ssd.small import SIZES, SSD300_SIZES, SSDSmall
    from medaidet.ssd.weights import materialize

    assert stated("04", r"SSD300's smallest boxes are (\d+) px; the small\s+SSD's start at "
                        r"(\d+) px") == (SSD300_SIZES[0], SIZES[0])
    assert stated("README.md", r"`SIZES`: (\d+) px first, where SSD300 starts at (\d+) px") == (
        SIZES[0], SSD300_SIZES[0])
    small = materialize(SSDSmall(n_fg_class=3))
    millions, = stated("README.md", r"batch normalisation \(([\d.]+) M\s+parameters")
    assert round(sum(p.size for p in small.params()) / 1e6, 1) == millions
    grids = stated("README.md", r"SSD300's grids \((\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)")
    assert grids == tuple(small.extractor.grids) == tuple(
        build_ssd("ssd300", pretrained=None).extractor.grids)


@pytest.mark.filterwarnings("ignore::medaidet.data.bccd.AnnotationWarning")
def test_red_cell_size(bccd_root):
    from medaidet.data import BCCD_LABEL_NAMES, BCCDDataset

    across, at_300 = stated("01", r"a whole red cell is about (\d+) px across\s+in these "
                                  r"640×480 images: section 4's (\d+) px at 300×300")
    rbc = BCCD_LABEL_NAMES.index("rbc")
    sides = []
    for split in ("train", "val"):
        boxes = BCCDDataset(bccd_root, split).slice[:, ("bbox", "label")]
        for i in range(len(boxes)):
            bbox, label = boxes[i]
            red = bbox[label == rbc]
            sides.extend(np.sqrt((red[:, 2] - red[:, 0]) * (red[:, 3] - red[:, 1])))
    median = float(np.median(sides))              # in the 640x480 image's pixels
    assert round(median * np.sqrt(300 * 300 / (640 * 480))) == at_300
    assert median == pytest.approx(across, rel=0.1)


def test_memory_headroom_of_the_out_of_memory_demo():
    from medaidet.extras.troubleshoot import out_of_memory_demo

    headroom, = stated("07", r"plus ([\d.]+) images' worth")
    assert inspect.signature(out_of_memory_demo).parameters["headroom"].default == headroom
