"""The environment (notebook 00): the doctor, Colab setup and the papermill course runner."""

# The profiles the notebooks are written for (training's cpu profile is not one of them yet),
# and the seconds a cell may take in each. Here, not in env/course.py, so that the command
# line offers them before anything is installed.
CELL_TIMEOUT = {"smoke": 600, "full": 7200}
COURSE_PROFILES = tuple(CELL_TIMEOUT)
