"""Evaluation (notebooks 04 and 05): VOC average precision and cell counting."""
