# Two commands matter: `make book` and `make test`. Each creates .venv and installs the pinned
# environment on first use (and again only when pyproject.toml or constraints.txt change).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SMOKE_BUILD := _build/smoke
LIB_SOURCES := $(shell find lib -name '*.py' 2>/dev/null)

.PHONY: help install book test lint unit notebooks book-smoke browser clean compile-report \
	triton-check

help:
	@echo "make book   execute every chapter (this machine's profile) and build _build/html"
	@echo "make test   lint, unit tests, chapters under nbmake (smoke), book build, browser check"
	@echo "make clean  remove build outputs (keeps .venv)"
	@echo "make install  create .venv and install the pinned environment (the others do it first)"
	@echo "make compile-report  compile every kernel tile for sm_80/sm_90, write the report"
	@echo "make triton-check TRITON=3.6.0  compile the kept tiles with another Triton, compare"

# Two targets started at once (`make book & make test`) must not both build .venv (one would run
# pip while the other is still creating the venv: "No module named pip"). The install holds an
# exclusive lock on $(LOCK), taken on file descriptor 9 by flock(1) where it exists (Linux) or by
# Python's fcntl.flock (macOS); inside the lock it checks again whether the other run has installed
# everything meanwhile.
LOCK := $(VENV)/.install.lock
LOCK_FD9 := if command -v flock >/dev/null 2>&1; then flock 9; \
	else $(PYTHON) -c 'import fcntl; fcntl.flock(9, fcntl.LOCK_EX)'; fi
UP_TO_DATE := [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt constraints.txt ]
PIP_INSTALL := $(PY) -m pip install --quiet --constraint constraints.txt --editable ".[dev]"

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; v = sys.version_info; assert v >= (3, 10), \
		f"Python >= 3.10 is needed, found {v.major}.{v.minor}"'
	@mkdir -p $(VENV)
	@( $(LOCK_FD9) && \
	if $(UP_TO_DATE); then echo "$(VENV) is up to date (installed by another make)"; \
	else echo "installing $(VENV) (lock: $(LOCK))" && \
		{ test -x $(PY) || $(PYTHON) -m venv $(VENV); } && \
		echo "$(PIP_INSTALL)" && $(PIP_INSTALL) && touch $(STAMP); fi ) 9>>$(LOCK)

install: $(STAMP)

# The execution cache keys on cell text only: drop it when the library changed.
_build/.lib-stamp: $(LIB_SOURCES)
	rm -rf _build/.jupyter_cache _build/jupyter_execute
	mkdir -p _build && touch $@

# ... and when the profile changed since the last build.
book: $(STAMP) _build/.lib-stamp
	@if [ "$$(cat _build/.profile 2>/dev/null)" != "$${MLSYS_PROFILE:-auto}" ]; then \
		rm -rf _build/.jupyter_cache _build/jupyter_execute; \
		echo "$${MLSYS_PROFILE:-auto}" > _build/.profile; fi
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@echo "Book: file://$(CURDIR)/_build/html/index.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check lib tests notebooks conftest.py

unit: $(STAMP)
	MLSYS_PROFILE=smoke $(PY) -m pytest -m "not browser" -q

notebooks: $(STAMP)
	MLSYS_PROFILE=smoke OMP_NUM_THREADS=1 \
		$(PY) -m pytest --nbmake --nbmake-timeout=300 -n 2 -q notebooks

# A fresh smoke-profile build of the book, separate from `make book`'s cached one.
book-smoke: $(STAMP)
	rm -rf $(SMOKE_BUILD)
	MLSYS_PROFILE=smoke \
		$(VENV)/bin/jupyter-book build . -W -n --keep-going --path-output $(SMOKE_BUILD)

browser: $(STAMP)
	MLSYS_BOOK_HTML=$(SMOKE_BUILD)/_build/html $(PY) -m pytest -m browser -q tests/book/test_browser.py

test: lint unit notebooks book-smoke browser

# The compile report: every kernel and candidate tile compiled for sm_80 and sm_90 (no GPU),
# written to lib/mlsys/kernels/compile_report.json (tens of minutes on 2 cores; cached after).
compile-report: $(STAMP)
	$(PY) -m mlsys.kernels.compile_report --matrix full

# Every tile the kernels keep, compiled by another Triton in a throwaway venv (TRITON=3.6.0 by
# default: the version torch 2.11 requires), then compared with the committed report.
TRITON ?= 3.6.0
TRITON_VENV := _build/triton-$(TRITON)
triton-check: $(STAMP)
	@test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	grep -v '^triton' constraints.txt > $(TRITON_VENV)/constraints.txt
	$(TRITON_VENV)/bin/pip install --quiet "triton==$(TRITON)" -c $(TRITON_VENV)/constraints.txt \
		torch numpy einops jaxtyping beartype matplotlib tqdm
	PYTHONPATH=lib MLSYS_AOT_CACHE=$(TRITON_VENV)/aot-cache $(TRITON_VENV)/bin/python \
		-m mlsys.kernels.compile_report --matrix ci --kept --out $(TRITON_VENV)/report.json
	$(PY) -m mlsys.kernels.compile_report --compare $(TRITON_VENV)/report.json

clean:
	rm -rf _build notebooks/*.ipynb .pytest_cache
