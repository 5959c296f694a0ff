"""The course's colours, each meaning one thing in every figure: the class hues
(:data:`CLASS_COLORS`, also in the exported model and web page); :data:`OUTCOME_STYLES` (what
became of a box) use none and differ by line style too (colour-blind readers, grey print);
anything else (:func:`line_style`, :func:`bar_style`) is black and greys. Standard library only."""

__all__ = ["CLASS_COLORS", "OUTCOME_STYLES", "OUTCOME_LABELS", "line_style", "bar_style"]

#: One colour per class (matplotlib's tab:red, tab:blue, tab:green).
CLASS_COLORS = {"rbc": "#d62728", "wbc": "#1f77b4", "platelets": "#2ca02c"}

#: How each outcome of a detection is drawn (matplotlib ``Rectangle`` keywords): no class hue.
OUTCOME_STYLES = {
    "tp": dict(edgecolor="black", linestyle="-", linewidth=1.4),
    "fp": dict(edgecolor="#E69F00", linestyle="--", linewidth=1.8),     # Okabe-Ito orange
    "missed": dict(edgecolor="black", linestyle=":", linewidth=2.2),
}
OUTCOME_LABELS = {"tp": "true positive", "fp": "false positive", "missed": "missed (annotated)"}

# (colour, line style, marker, hatch) of the k-th series of a figure: greys only
_SERIES = (("black", "-", "o", ""), ("0.5", "--", "s", "//"), ("0.75", "-.", "^", ".."),
           ("0.3", ":", "D", "xx"), ("0.6", (0, (5, 1, 1, 1)), "v", "\\\\"))


def line_style(k: int) -> dict:
    """``plot`` keywords of the ``k``-th line of a figure (a split, a run, a protocol)."""
    color, linestyle, marker, _ = _SERIES[k % len(_SERIES)]
    return dict(color=color, linestyle=linestyle, marker=marker)


def bar_style(k: int) -> dict:
    """``bar``/``hist`` keywords of the ``k``-th series of bars: a grey with a hatching."""
    color, _, _, hatch = _SERIES[k % len(_SERIES)]
    return dict(color=color, hatch=hatch, edgecolor="black", linewidth=0.6)
