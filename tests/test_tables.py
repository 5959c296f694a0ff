"""medaidet.tables: a result table renders itself as Markdown and as text."""
import math

import pytest

from medaidet.tables import Table


def test_markdown_right_aligns_number_columns_and_formats_cells():
    table = Table(["split", "images", "mAP"], [["train", 205, 0.8912], ["val", 87, None]])
    assert table.to_markdown().splitlines() == [
        "| split | images | mAP |", "|---|---:|---:|",
        "| train | 205 | 0.891 |", "| val | 87 | n/a |"]
    assert table._repr_markdown_() == table.to_markdown()
    assert Table(["x"], [[math.nan]]).cell(math.nan) == "n/a"


def test_text_is_aligned_for_a_terminal():
    table = Table(["class", "AP"], [["rbc", 0.84], ["platelets", 0.9]], float_format=".2f")
    assert str(table).splitlines() == ["class        AP", "rbc        0.84",
                                       "platelets  0.90"]
    assert repr(table) == str(table)          # text/plain in a notebook: the table, no dump


def test_a_row_of_the_wrong_length_is_named():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells for 2 columns \(a, b\)"):
        Table(["a", "b"], [[1, 2], [3]])
    table = Table(["a", "b"])
    with pytest.raises(ValueError, match="a row of 3 cells for 2 columns"):
        table.append([1, 2, 3])


def test_title_and_notes_frame_the_table_and_a_pipe_stays_in_its_cell():
    table = Table(["a"], [["x|y"]], title="T", notes=["n"])
    assert table.to_markdown() == "T\n\n| a |\n|---|\n| x\\|y |\n\nn"
    assert str(table) == "T\n\na\nx|y\n\nn"
