# The two README commands: `make book` and `make test`. Each bootstraps .venv on first use,
# from the lock file (exact versions and hashes), and re-installs only when the lock changes.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROFILE ?= default
LOCK := requirements.lock
STAMP := $(VENV)/.installed-stamp
# uv (pinned) in its own venv installs .venv from the lock and writes the lock (`make lock`),
# so the tool never changes the book's environment.
UV_VERSION := 0.13.9
LOCK_TOOLS := _build/lock-tools
UV := $(LOCK_TOOLS)/bin/uv
GET_UV = test -x $(UV) || { $(PYTHON) -m venv $(LOCK_TOOLS) && \
  $(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION); }
# torch==2.13.0 is the CPU wheel: a local wheel folder where the machine has one (uv does not
# read pip's find-links), else PyTorch's CPU index. Either way the lock pins 2.13.0+cpu.
TORCH_WHEELS ?= /opt/wheels
TORCH_SOURCE := $(if $(wildcard $(TORCH_WHEELS)/torch-2.13.0*),--find-links $(TORCH_WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: book test chromium tesseract lab lock clean clean-cache clean-stale data-link help
help:
	@echo "make book [PROFILE=smoke|default|full] [FORCE=1] [JOBS=n]  execute the notebooks whose inputs"
	@echo "                                          changed (all with FORCE=1; n at once, default 2), then build the HTML"
	@echo "make test                                 pytest, the book in the smoke profile, every page in Chromium"
	@echo "make chromium                             install Chromium if missing (root + apt-get), else say how"
	@echo "make lab                                  JupyterLab on the project's kernel (prints the URL)"
	@echo "make lock                                 regenerate $(LOCK) from pyproject.toml (UPGRADE=1: newest versions)"
	@echo "make clean                                remove _build (keeps .venv and data/cache)"
	@echo "make clean-cache                          remove data/cache (sweep results, OCR readings, datasets)"
	@echo "make clean-stale                          remove the sweep's row caches of other code versions in"
	@echo "                                          data/cache (prints each file and the bytes freed; DRY=1: list only)"

# Python's bytecode caches (.pyc) are written on first import, Python's default, even where
# the environment turns them off (PYTHONDONTWRITEBYTECODE, as on these machines): otherwise
# every kernel and sweep worker would compile the modules it imports again.
unexport PYTHONDONTWRITEBYTECODE

# uv (pinned, in its own venv) installs the locked wheels: 27 s from a cold cache on the 2-core
# machine where pip took 3 min 45 s; it does not byte-compile all 2 GB of packages up front
# (--compile-bytecode: 76 s), the first import of a module does (above).
$(STAMP): $(LOCK) pyproject.toml book/pyproject.toml
	$(GET_UV)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(UV) pip install --quiet --python $(PY) --index-strategy unsafe-best-match \
	  $(TORCH_SOURCE) -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . -e book
	$(PY) -m ipykernel install --sys-prefix --name fovea --display-name "Python (fovea)" >/dev/null
	touch $@

lock: pyproject.toml
	$(GET_UV)
	# uv keeps the pins it finds in its output file (unless UPGRADE=1): start from the lock
	if [ -f $(LOCK) ]; then cp $(LOCK) $(LOCK_TOOLS)/$(LOCK); fi
	$(UV) pip compile pyproject.toml --extra book --extra test --extra ocr \
	  --python-version 3.11 --generate-hashes --index-strategy unsafe-best-match \
	  $(TORCH_SOURCE) $(if $(UPGRADE),--upgrade,) --custom-compile-command "make lock" \
	  --quiet -o $(LOCK_TOOLS)/$(LOCK)
	grep -q '^torch==2.13.0+cpu' $(LOCK_TOOLS)/$(LOCK) || { echo "$(LOCK): torch is not the 2.13.0 CPU wheel" >&2; exit 1; }
	# replace the lock only when it changed (its mtime decides whether make reinstalls .venv)
	if cmp -s $(LOCK_TOOLS)/$(LOCK) $(LOCK); then rm $(LOCK_TOOLS)/$(LOCK); echo "$(LOCK) unchanged"; \
	else mv $(LOCK_TOOLS)/$(LOCK) $(LOCK); echo "$(LOCK) updated"; fi

# Datasets are read from $FOVEA_DATA (default data/external); link the shared copy if it is there.
data-link:
	@if [ ! -e data/external ] && [ -d ../shared/datasets ]; then \
	  ln -s ../../shared/datasets data/external && echo "linked data/external -> ../shared/datasets"; fi

book: tesseract $(STAMP) data-link
	$(PY) -m fovea_book.build all --profile $(PROFILE) $(if $(FORCE),--force,) $(if $(JOBS),--jobs $(JOBS),)

# Chromium first (the last step needs it): installed where .ci/chromium.sh can (root with
# apt-get), else make test stops here, before the set-up, with the one-line instruction.
chromium:
	@.ci/chromium.sh

# The second OCR reader (tesseract): installed where .ci/tesseract.sh can, else its tests and
# book sections are skipped with the reason (optional, never stops the build).
tesseract:
	@.ci/tesseract.sh

test: chromium tesseract $(STAMP) data-link
	$(PY) -m pytest -q
	$(PY) -m fovea_book.build all --profile smoke
	$(PY) -m fovea_book.build check-html

lab: $(STAMP) data-link
	$(PY) -m fovea_book.build lab

clean:
	rm -rf _build .pytest_cache .hypothesis
	@echo "removed _build; computed caches in data/cache are kept (make clean-cache removes them)"

clean-cache:
	rm -rf data/cache
	@echo "removed data/cache (sweep results, OCR readings, loaded datasets; the next book run recomputes them)"

# The row caches of other versions of the book's source (their keys can never match
# again); the current code's cache is kept. Not while a book or sweep is running.
clean-stale: $(STAMP)
	$(PY) -m fovea_book.build clean-stale $(if $(DRY),--dry-run,)
