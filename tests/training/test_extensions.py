"""medaidet.training.extensions: what a run shows while it trains."""
from types import SimpleNamespace

import pytest

from medaidet.training.extensions import Plotter


def test_the_validation_line_says_why_a_class_has_no_ap(tmp_path):
    """ChainerCV's AP is NaN for a class with no box in the validation images (a few images
    in a short run): the line says so instead of printing nan."""
    entry = {"iteration": 3, "epoch": 1.0, "main/loss": 1.0, "validation/main/map": 0.5,
             "validation/main/ap/rbc": 0.4, "validation/main/ap/wbc": 0.6,
             "validation/main/ap/platelets": float("nan")}
    lines = []
    plotter = Plotter(tmp_path, SimpleNamespace(log=[entry]), SimpleNamespace(write=lines.append),
                      is_end=lambda trainer: True)
    plotter(trainer=None)
    plotter(trainer=None)                       # each validation is shown once
    assert lines == ["iteration 3: val mAP 0.500 (rbc 0.400, wbc 0.600, "
                     "platelets n/a (no boxes))"]
    assert (tmp_path / "map.png").is_file()


def test_the_ap_plot_draws_each_class_in_its_course_colour(tmp_path):
    """map.png: every class in CLASS_COLORS (the colour every figure of the course gives it),
    no colour from matplotlib's default cycle, and the split named on the axis."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from PIL import Image

    from medaidet.data.bccd import CLASS_COLORS
    from medaidet.training.extensions import write_plots

    log = [{"iteration": i, "main/loss": 3.0 - i / 10, "validation/main/map": 0.1 * i,
            "validation/main/ap/rbc": 0.08 * i, "validation/main/ap/wbc": 0.12 * i,
            "validation/main/ap/platelets": 0.05 * i} for i in range(1, 8)]
    paths = write_plots(log, tmp_path, val_split="val")
    pixels = np.asarray(Image.open(paths["map"]).convert("RGB")).reshape(-1, 3)
    present = {tuple(p) for p in np.unique(pixels, axis=0)}

    def rgb(colour):
        return tuple(round(255 * v) for v in to_rgb(colour))

    for name, colour in CLASS_COLORS.items():
        assert rgb(colour) in present, name
    assert rgb("tab:orange") not in present        # the default cycle's second colour


@pytest.mark.parametrize("course_run, most", [(None, 205), ("1", 12)])
def test_a_headless_course_run_stores_a_short_progress_bar(monkeypatch, capsys, course_run,
                                                           most):
    """Each redraw of the bar is an output a stored notebook keeps: about 200 at most where
    someone watches, about 10 in `medaidet course run`."""
    from medaidet.training.extensions import Monitor

    if course_run:
        monkeypatch.setenv("MEDAIDET_COURSE_RUN", course_run)
    else:
        monkeypatch.delenv("MEDAIDET_COURSE_RUN", raising=False)
    monitor = Monitor(total=1000, progress=True)
    trainer = SimpleNamespace(updater=SimpleNamespace(iteration=0),
                              observation={"main/loss": 1.0})
    monitor.initialize(trainer)
    monitor.bar.mininterval = 0          # redraws limited by iterations only, not by time
    for _ in range(1000):
        monitor(trainer)
    monitor.finalize()
    redraws = capsys.readouterr().out.count("\r")
    assert most // 2 < redraws <= most
