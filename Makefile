# The two commands of the README. Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
JOBS ?= 2

.PHONY: test demo venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/kaun-ir demo

clean:
	rm -rf $(VENV) demo_out .pytest_cache
