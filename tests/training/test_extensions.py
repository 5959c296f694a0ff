"""medaidet.training.extensions: what a run shows while it trains."""
from types import SimpleNamespace

import numpy as np
from PIL import Image

from medaidet.training.extensions import Monitor, Plotter, write_plots


def test_the_validation_line_says_why_a_class_has_no_ap(tmp_path):
    """ChainerCV's AP is NaN for a class without boxes in the (few) validation images."""
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


def test_a_run_without_progress_prints_no_validation_line(capsys, monkeypatch):
    monkeypatch.setenv("MEDAIDET_COURSE_RUN", "1")    # the plain lines of a course run
    Monitor(total=10, progress=False).write("iteration 3: val mAP 0.500")
    assert capsys.readouterr().out == ""
    Monitor(total=10, progress=True).write("iteration 3: val mAP 0.500")
    assert capsys.readouterr().out == "iteration 3: val mAP 0.500\n"


def test_the_ap_plot_draws_each_class_in_its_course_colour(tmp_path):
    from matplotlib.colors import to_rgb

    from medaidet.data.bccd import CLASS_COLORS

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


def test_the_plots_mark_each_learning_rate_step_the_run_reached(tmp_path):
    log = [{"iteration": i, "main/loss": 3.0 - i / 10, "validation/main/map": 0.1 * i}
           for i in range(1, 8)]

    def pixels(name, **kwargs):
        folder = tmp_path / name
        folder.mkdir()
        return {k: np.asarray(Image.open(v).convert("L"))
                for k, v in write_plots(log, folder, **kwargs).items()}

    plain, stepped, beyond = pixels("plain"), pixels("stepped", lr_steps=[4]), \
        pixels("beyond", lr_steps=[40])
    for name in ("loss", "map"):
        assert not np.array_equal(plain[name], stepped[name]), name
        assert np.array_equal(plain[name], beyond[name]), name


def test_a_learning_rate_step_applies_after_the_first_iteration_reaching_its_epoch():
    from medaidet.training.config import TrainConfig
    from medaidet.training.train import Length

    config = TrainConfig.profile("cpu").replace(lr_steps=(30, 35.5))
    assert Length(config, n_images=205, batch_size=4).lr_step_iterations == [1538, 1820]


def _run_monitor(total):
    monitor = Monitor(total=total, progress=True)
    trainer = SimpleNamespace(updater=SimpleNamespace(iteration=0),
                              observation={"main/loss": 1.0})
    monitor.initialize(trainer)
    for _ in range(total):
        trainer.updater.iteration += 1
        monitor(trainer)
    monitor.finalize()
    return monitor


def test_a_headless_course_run_stores_ten_progress_lines(monkeypatch, capsys):
    """Every redraw of a bar is an output a stored notebook keeps (tqdm redraws on a timer)."""
    monkeypatch.setenv("MEDAIDET_COURSE_RUN", "1")
    monitor = _run_monitor(1000)
    out = capsys.readouterr().out
    assert monitor.bar is None and "\r" not in out
    lines = out.splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("train: 100/1000 iterations, ") and lines[0].endswith("loss 1.000")
    assert lines[-1].startswith("train: 1000/1000 iterations, ")


def test_where_someone_watches_progress_is_a_bar(monkeypatch):
    from tqdm import tqdm

    monkeypatch.delenv("MEDAIDET_COURSE_RUN", raising=False)
    monitor = Monitor(total=1000, progress=True)
    monitor.initialize(SimpleNamespace(updater=SimpleNamespace(iteration=0)))
    assert isinstance(monitor.bar, tqdm) and monitor.lines_every is None
    assert monitor.bar.miniters == 5             # at most ~200 redraws of 1000 iterations
    monitor.finalize()
