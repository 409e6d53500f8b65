# Every target sets up .venv first (once, and again when requirements change).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg

.PHONY: setup export check-export test book execute clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

export: $(STAMP)
	$(PY) tools/export.py

check-export: $(STAMP)
	$(PY) tools/export.py --check

# Unit tests and every stored notebook output (nbval, strict), in one pytest run.
test: check-export
	$(PY) -m pytest tests chapters $(NBVAL)

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --all -W --keep-going

execute: $(STAMP)
	$(PY) tools/execute.py $(NB)

clean:
	rm -rf _build
