"""medaidet.training.extensions: what a run shows while it trains."""
from types import SimpleNamespace

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
