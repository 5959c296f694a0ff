"""Tables that render themselves: as Markdown in a notebook, as aligned text in a terminal.
Cells are written as given, except non-integer reals (``float_format``) and missing values
(``None``, NaN: ``n/a``); all-number columns are right-aligned. A result class deriving from
:class:`ShownAsTable` is shown as its ``table()``."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from medaidet.numbers import is_real

__all__ = ["Table", "ShownAsTable"]


@dataclass(repr=False)
class Table:
    """``columns``: the header; ``rows``: one sequence of cells per row, as many as columns."""

    columns: list
    rows: list = field(default_factory=list)
    float_format: str = ".3f"
    title: str = ""
    notes: list = field(default_factory=list)

    def __post_init__(self):
        self.columns = [str(c) for c in self.columns]
        self.rows = [list(row) for row in self.rows]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"Table: row {i} has {len(row)} cells for "
                                 f"{len(self.columns)} columns ({', '.join(self.columns)})")

    def append(self, row) -> None:
        """Add one row (as many cells as columns)."""
        if len(row := list(row)) != len(self.columns):
            raise ValueError(f"Table: a row of {len(row)} cells for {len(self.columns)} "
                             f"columns ({', '.join(self.columns)})")
        self.rows.append(row)

    def cell(self, value) -> str:
        """The text of one cell."""
        if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
            return "n/a"
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
            return format(float(value), self.float_format)
        return str(value)

    def _numeric(self) -> list:
        return [bool(self.rows) and all(is_real(row[j]) or row[j] is None for row in self.rows)
                for j in range(len(self.columns))]

    def _framed(self, table: str) -> str:
        return "\n\n".join([self.title] * bool(self.title) + [table] + list(self.notes))

    def to_markdown(self) -> str:
        def line(cells):
            return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        lines = [line(self.columns),
                 "|" + "|".join("---:" if n else "---" for n in self._numeric()) + "|"]
        lines += [line([self.cell(v) for v in row]) for row in self.rows]
        return self._framed("\n".join(lines))

    _repr_markdown_ = to_markdown   # what Jupyter shows

    def __str__(self) -> str:
        texts = [self.columns] + [[self.cell(v) for v in row] for row in self.rows]
        widths = [max(len(t[j]) for t in texts) for j in range(len(self.columns))]
        numeric = self._numeric()
        return self._framed("\n".join("  ".join(t[j].rjust(w) if numeric[j] else t[j].ljust(w)
                                                for j, w in enumerate(widths)).rstrip()
                                      for t in texts))

    __repr__ = __str__       # Jupyter's text/plain, and any viewer that shows only that


class ShownAsTable:
    """Shows a result as its ``table()``: Markdown in a notebook, text in a terminal."""

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()
