# The two README commands: `make book` and `make test`. Each bootstraps .venv on first use.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROFILE ?= default
# Re-install only when the package metadata changes.
STAMP := $(VENV)/.installed-stamp

.PHONY: book test lab clean data-link help
help:
	@echo "make book [PROFILE=smoke|default|full]  execute every notebook with papermill, build the HTML"
	@echo "make test                               pytest, then the whole book in the smoke profile"
	@echo "make lab                                JupyterLab on the project's kernel"
	@echo "make clean                              remove _build (keeps .venv)"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[book,test,ocr]'
	$(PY) -m ipykernel install --sys-prefix --name fovea --display-name "Python (fovea)" >/dev/null
	touch $@

# Datasets are read from $FOVEA_DATA (default data/external); link the shared copy if it is there.
data-link:
	@if [ ! -e data/external ] && [ -d ../shared/datasets ]; then \
	  ln -s ../../shared/datasets data/external && echo "linked data/external -> ../shared/datasets"; fi

book: $(STAMP) data-link
	$(PY) -m fovea_core.book all --profile $(PROFILE)

test: $(STAMP) data-link
	$(PY) -m pytest -q
	$(PY) -m fovea_core.book all --profile smoke

lab: $(STAMP) data-link
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

clean:
	rm -rf _build .pytest_cache .hypothesis
