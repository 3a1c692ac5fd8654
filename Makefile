# Two entry points for a fresh machine (README.md): `make demo` and `make test`.
# Both create .venv on first use with the CPU build of torch and this package in editable mode.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Triton kernels run on the CPU through Triton's interpreter when no GPU is present.
CPU_ENV := TRITON_INTERPRET=1 OPSELECT_CACHE_DIR=$(CURDIR)/.cache/opselect-demo

.PHONY: demo test gpu-test setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,hf]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(CPU_ENV) $(VENV)/bin/opselect demo

test: $(VENV)/.installed
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV) .cache .pytest_cache
