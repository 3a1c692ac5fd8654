# Two entry points for a fresh machine (README.md): `make demo` and `make test`.
# Both create .venv on first use with the CPU build of torch and this package in editable mode.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Triton kernels run on the CPU through Triton's interpreter when no GPU is present.
CPU_ENV := TRITON_INTERPRET=1 OPSELECT_CACHE_DIR=$(CURDIR)/.cache/opselect-demo

.PHONY: demo test test-slow test-all setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,hf]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(CPU_ENV) $(VENV)/bin/opselect demo

# The quick suite (every backend of every op through the interpreter; at most 5 minutes on two
# cores: a test that takes more than about 3 s there is marked slow and runs in test-slow).
test: $(VENV)/.installed
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n 2 -m "not slow" tests

# The long tests alone: OpInfo sweeps, fuzzing, every benchmark script's smoke run, lock holders.
test-slow: $(VENV)/.installed
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n 2 -m slow tests

# Everything (what CI runs: test, then test-slow).
test-all: test test-slow

clean:
	rm -rf $(VENV) .cache .pytest_cache
