# Two commands on a fresh Linux machine (see README):
#   make run    set up if needed, then run the course with papermill
#   make test   set up if needed, then run the tests under Python 3.11 + NumPy 1.26
#               and Python 3.12 + NumPy 2.x
# Interpreters are found on PATH or in pyenv; override: make test PY311=/path/python3.11

# (pyenv's shims are skipped: they fail for versions that are not selected)
VENV311 := .venv-py311
VENV312 := .venv-py312
find_python = $(firstword $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1)))) \
                          $(filter-out %/shims/python$(1),$(shell command -v python$(1) 2>/dev/null)))
PY311 ?= $(call find_python,3.11)
PY312 ?= $(call find_python,3.12)
# PROFILE, COURSE_LANG, SEED and OUT (where `make run` writes, and what `make clean` removes) are taken from
# the command line only (`make run PROFILE=cpu OUT=DIR`): a makefile's own assignment wins
# over a variable of the same, common name that happens to be exported.
PROFILE := auto
# COURSE_LANG=ja runs the Japanese edition (notebooks/ja/) into outputs/ja (not LANG: that
# is the locale).
COURSE_LANG := en
ifeq ($(filter $(COURSE_LANG),en ja),)
$(error COURSE_LANG=$(COURSE_LANG) is not an edition of the course: use en or ja)
endif
# SEED=N trains notebook 03's detector with seed N (default: the profile's).
SEED :=
OUT := $(if $(filter en,$(COURSE_LANG)),outputs,outputs/$(COURSE_LANG))
# --durations: each shard names its 25 slowest tests, where CI's time goes
PYTEST_ARGS ?= -q --durations=25
PY := $(VENV312)/bin/python
# The file the course runner leaves in every output folder it made (medaidet_tools.course).
OUT_MARKER := .medaidet-course

SETUP_INPUTS := pyproject.toml $(shell find tools/medaidet_tools/stack -name '*.py' 2>/dev/null)

# Every path is quoted in the recipes: `make run "OUT=my outputs"` works.
.PHONY: run lab site test test-py311 test-py312 setup bccd txl-pbc clean

run: $(VENV312)/.ready bccd txl-pbc
	"$(PY)" -m medaidet stack install --cuda auto
	"$(PY)" -m medaidet course run --profile "$(PROFILE)" --lang "$(COURSE_LANG)" --out "$(OUT)"$(if $(SEED), --seed "$(SEED)")

# The notebooks in JupyterLab, to study and change them, in the environment `make run` ran
# them in (.venv-py312, with JupyterLab from the `lab` extra); COURSE_LANG=ja opens the
# Japanese edition. The environment's kernel is also registered for the user as
# "medaidet (Python 3.12)", for another Jupyter (VS Code, a system JupyterLab) to pick.
# LAB_ARGS passes options to JupyterLab: make lab LAB_ARGS="--no-browser --port 8890".
# As root (a container), JupyterLab refuses to start without --allow-root: it is added then.
LAB_ARGS :=
NOTEBOOK_DIR := $(if $(filter en,$(COURSE_LANG)),notebooks,notebooks/$(COURSE_LANG))
lab: $(VENV312)/.lab bccd txl-pbc
	"$(PY)" -m jupyterlab --ServerApp.root_dir="$(NOTEBOOK_DIR)"$(if $(filter 0,$(shell id -u)), --allow-root) $(LAB_ARGS)

$(VENV312)/.lab: $(VENV312)/.ready
	"$(PY)" -m pip install -q --disable-pip-version-check -e '.[lab]'
	"$(PY)" -m ipykernel install --user --name medaidet --display-name "medaidet (Python 3.12)"
	touch $@

# The executed course as a static website in site/ (both editions, tools/build_site.py), from
# the notebooks `make run` left in $(OUT) (and `make run COURSE_LANG=ja` in $(OUT)/ja: until
# then the Japanese pages show the notebooks without outputs, and say so); it says to run the
# course first when nothing was run. Builds offline (Sphinx, myst-nb: the `site` extra), in a
# temporary folder: nothing but site/ is written. The Colab links appear once pyproject's
# [project.urls] Repository is a real address (or: make site SITE_ARGS="--repository URL").
SITE_ARGS :=
site: $(VENV312)/.site
	"$(PY)" tools/build_site.py --outputs "$(OUT)" --out site $(SITE_ARGS)

$(VENV312)/.site: $(VENV312)/.ready
	"$(PY)" -m pip install -q --disable-pip-version-check -e '.[site]'
	touch $@

# BCCD for the course and the tests: the copy $$MEDAIDET_DATA names, else the cache's, each
# verified against the manifest; with neither, the real download into the cache. Without a
# network that stops here, in one message saying where to put a copy.
bccd: $(VENV312)/.ready
	"$(PY)" -m medaidet data download

# TXL-PBC, a re-annotation of BCCD's images (notebook 10), the same way: $$MEDAIDET_TXL_PBC,
# else the cache, else the real download into the cache.
txl-pbc: $(VENV312)/.ready
	"$(PY)" -m medaidet data download --dataset txl-pbc

# Both interpreters' suites run side by side (one per core); each one's output is
# printed whole when it finishes, and either failing fails `make test`.
# The slow tests (marked slow: real training, notebooks, MPI ranks) and those that read text,
# files and pages rather than numbers are split between the two (tests/conftest.py,
# MEDAIDET_TEST_SHARD); `make test-py311` alone runs them all.
# One BLAS/OpenMP thread per suite: two suites with a thread per core each would fight
# over the cores (measured: SSD steps ~30% slower side by side).
test: $(VENV311)/.ready $(VENV312)/.ready bccd txl-pbc
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
		$(MAKE) --no-print-directory -j2 --output-sync=target test-py311 test-py312 \
		SHARD311=0/2 SHARD312=1/2

test-py311: $(VENV311)/.ready
	$(if $(SHARD311),MEDAIDET_TEST_SHARD=$(SHARD311)) "$(VENV311)/bin/python" -m pytest $(PYTEST_ARGS)

test-py312: $(VENV312)/.ready
	$(if $(SHARD312),MEDAIDET_TEST_SHARD=$(SHARD312)) "$(VENV312)/bin/python" -m pytest $(PYTEST_ARGS)

setup: $(VENV311)/.ready $(VENV312)/.ready

# One venv per interpreter; the stack is installed by our own installer,
# exactly as a user would (the NumPy pin picks the platform under test).
$(VENV311)/.ready: $(SETUP_INPUTS)
	@test -n "$(PY311)" || { echo "make: no Python 3.11 found; install it or pass PY311=/path/to/python3.11" >&2; exit 1; }
	"$(PY311)" -m venv "$(VENV311)"
	"$(VENV311)/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 'numpy>=1.26,<2'
	"$(VENV311)/bin/python" -m medaidet stack install --cuda none
	touch $@

$(VENV312)/.ready: $(SETUP_INPUTS)
	@test -n "$(PY312)" || { echo "make: no Python 3.12 found; install it or pass PY312=/path/to/python3.12" >&2; exit 1; }
	"$(PY312)" -m venv "$(VENV312)"
	"$(VENV312)/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 'numpy>=2,<2.6'
	"$(VENV312)/bin/python" -m medaidet stack install --cuda none
	touch $@

# Removes the venvs, and OUT only where the course runner marked it as its own (a folder
# `make run` made): anything else of that name is left, with a note.
clean:
	rm -rf "$(VENV311)" "$(VENV312)" .pytest_cache
	@if [ -f "$(OUT)/$(OUT_MARKER)" ]; then echo "rm -rf \"$(OUT)\""; rm -rf -- "$(OUT)"; \
	elif [ -e "$(OUT)" ]; then echo "make clean: kept $(OUT): not a folder make run made \
	(it has no $(OUT_MARKER)); remove it yourself if you mean to" >&2; fi
