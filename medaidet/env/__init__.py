"""The environment (notebook 00): the doctor, Colab setup and the papermill course runner."""

# The profiles the notebooks are written for (smoke: CI's quick check of the mechanics; cpu:
# a learner without a GPU, who trains the small SSD in notebook 03; full: the recipe on a
# GPU), and the seconds a cell may take in each. Here, not in env/course.py, so that the
# command line offers them before anything is installed.
CELL_TIMEOUT = {"smoke": 600, "cpu": 3600, "full": 7200}
COURSE_PROFILES = tuple(CELL_TIMEOUT)
# The editions of the course: the English notebooks (notebooks/) and the Japanese ones
# (notebooks/ja/, the same file names and code), by the language code `--lang` takes.
COURSE_LANGS = {"en": "English", "ja": "Japanese (日本語版)"}
