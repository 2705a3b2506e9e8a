# The two commands of the README. Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
JOBS ?= 2

INTEROP_STAMP := $(VENV)/.interop-stamp

.PHONY: test test-interop demo venv clean fuzz fuzz-import

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

# The style gate first (ruff's lint rules and formatting, configured in pyproject.toml), then the suite.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(JOBS) --dist loadfile --ignore=tests/test_interop_torch.py \
		--ignore=tests/test_interop_torch_programs.py

# The tests that need the `interop` extra (PyTorch, transformers, flatbuffers), the `iree` extra
# (IREE's compiler and runtime) and the long tests: the two PyTorch files and the IREE backend's
# file (which `make test` skips, with its reason, without IREE), then every test marked `interop`
# or `long` (pyproject.toml), so nothing that
# `make test` ran runs again; last the StableHLO interpreter's own test suite, each case imported and
# run raw and optimised, when KAUN_IR_STABLEHLO_SUITE names a checkout of openxla/stablehlo (its
# tests skip otherwise; docs/interop.md, "The StableHLO interpreter's test suite"). Installs the extra into the same virtual environment on first use.
# Never touches the network at test time (the Hugging Face offline switches are set).
$(INTEROP_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[test,interop,iree]"
	@touch $(INTEROP_STAMP)

test-interop: $(INTEROP_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 KAUN_IR_LONG_TESTS=1 $(PY) -m pytest -q -n $(JOBS) --dist loadfile \
		tests/test_interop_torch.py tests/test_interop_torch_programs.py tests/test_iree.py
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 KAUN_IR_LONG_TESTS=1 $(PY) -m pytest -q -n $(JOBS) --dist loadfile \
		-m "long or interop" --ignore=tests/test_interop_torch.py --ignore=tests/test_interop_torch_programs.py \
		--ignore=tests/test_stablehlo_interpret_suite.py --ignore=tests/test_iree.py
	KAUN_IR_LONG_TESTS=1 $(PY) -m pytest -q -n $(JOBS) --dist load tests/test_stablehlo_interpret_suite.py

# A long fuzzing campaign of the textual IR parser (100,000 mutated texts, seeded; FUZZ_SEED=n)
FUZZ_INPUTS ?= 100000
FUZZ_SEED ?= 0
fuzz: $(STAMP)
	$(PY) tests/fuzz_ir.py --inputs $(FUZZ_INPUTS) --seed $(FUZZ_SEED)

demo: $(STAMP)
	$(VENV)/bin/kaun-ir demo

clean:
	rm -rf $(VENV) demo_out .pytest_cache

# A long fuzzing campaign of the StableHLO importer: mutated .mlir text and .mlirbc bytecode, each
# checked in a restartable worker process (deaths and raw errors fail it; an input unanswered for
# FUZZ_TIMEOUT seconds is a hang); 20,000 inputs unless FUZZ_INPUTS is given on the command line
FUZZ_TIMEOUT ?= 10
fuzz-import: $(STAMP)
	nice -n 10 $(PY) tests/fuzz_stablehlo.py --seed $(FUZZ_SEED) --timeout $(FUZZ_TIMEOUT) \
		--inputs $(if $(filter command line,$(origin FUZZ_INPUTS)),$(FUZZ_INPUTS),20000)

# One short run of the compiler path on a GPU machine (about 7 minutes): the machine's own Python
# and packages, nothing from a registry; logs and a summary in GPU_CHECK_OUT (docs/performance.md,
# "GPU"). GPU_CHECK_BACKEND=cpu GPU_CHECK_PYTHON=... runs the same script on the CPU.
GPU_CHECK_OUT ?= ./gpu-check-out
.PHONY: gpu-check
gpu-check:
	bash tools/gpu_check.sh $(GPU_CHECK_OUT)
