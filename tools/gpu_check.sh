#!/usr/bin/env bash
# `make gpu-check`: one short run of the compiler path on a GPU machine (about 7 minutes).
#
#   tools/gpu_check.sh [OUTDIR]        (default OUTDIR: ./gpu-check-out)
#
# Installs nothing from a package registry: it uses the machine's Python and the packages it
# already has (jax + jaxlib with the CUDA plugin, numpy, networkx, safetensors, optax, pytest,
# pytest-xdist; torch and transformers for the PyTorch parity part). kaun_ir itself goes into a
# throwaway virtual environment (--system-site-packages, `pip install --no-deps -e .`), or, where
# that cannot be made, onto the path through a small import shim. Then, with
# KAUN_IR_BACKEND=gpu, each part under `timeout` and with its own log in OUTDIR:
#
#   device.log   how kaun_ir was installed, nvidia-smi, the Python packages, jax.devices(),
#                kaun_ir's backend and one compiled call checked against NumPy
#   tests.log    (a) the compiler-path tests: forward, grad, vmap, jvp, scan, remat, mixed
#                precision, sharding on one device, training, layers, optimisers
#   tables.log   (a') every op's VJP and batching rule against JAX's
#   torch.log    (b) the real-model parity tests against PyTorch (ResNet, GPT-2, LSTM, ...)
#   bench.json   (c) `kaun-ir bench --json` per workload at its default size (bench.log: stderr)
#   summary.txt  one line per part: pytest's counts (or why there are none), the bench's rates
#
# A failing part does not stop the ones after it. Variables (for a dry run on the CPU):
#   GPU_CHECK_PYTHON   the Python to use (default python3)
#   GPU_CHECK_BACKEND  KAUN_IR_BACKEND for the parts (default gpu)
#   GPU_CHECK_JOBS     pytest-xdist workers (default 8)
#   GPU_CHECK_WORKLOADS  bench workloads (default mlp,transformer,cnn)
#   GPU_CHECK_BENCH_SECONDS  the time limit of one bench workload (default 50)
#   GPU_CHECK_PARTS    which of tests, tables, torch, bench to run (default: all four)
#   GPU_CHECK_INSTALL  shim: skip the throwaway environment, use the import shim
#   GPU_CHECK_TF32     1: leave TensorFloat-32 on for the test parts (default: off, see below)
set -u

OUT=${1:-./gpu-check-out}
PY=${GPU_CHECK_PYTHON:-python3}
BACKEND=${GPU_CHECK_BACKEND:-gpu}
JOBS=${GPU_CHECK_JOBS:-8}
WORKLOADS=${GPU_CHECK_WORKLOADS:-mlp,transformer,cnn}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kaun-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$(date +%s)

note() { echo "[gpu-check +$(($(date +%s) - START))s] $*"; }

# -------------------------------------------------------------------------------- install
# A throwaway environment: the machine's packages (every site directory of $PY, also where $PY is
# itself a virtual environment) plus kaun_ir installed editable without dependencies.
install_venv() {
    "$PY" -m venv --without-pip --system-site-packages "$WORK/venv" || return 1
    local site
    site=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    "$PY" -c 'import site, sys; print("\n".join(site.getsitepackages() + [p for p in sys.path if p.endswith("-packages")]))' \
        >"$site/_gpu_check_base.pth" || return 1
    "$PY" -m pip --python "$WORK/venv/bin/python" install --no-deps --no-build-isolation --no-index \
        --quiet -e . || return 1
    (cd "$WORK" && "$WORK/venv/bin/python" -c 'import kaun_ir.runtime, kaun_ir.tools.cli') || return 1
    RUN_PY="$WORK/venv/bin/python"
}

# Where no environment can be made (no setuptools, an old pip): a sitecustomize that maps the
# packages pyproject.toml places outside kaun_ir/ (passes/, runtime/, tools/) into kaun_ir.
install_shim() {
    mkdir -p "$WORK/shim"
    cat >"$WORK/shim/sitecustomize.py" <<EOF
import importlib.abc, importlib.util, os, sys
_ROOT = "$ROOT"
_MAP = {"kaun_ir": "kaun_ir", "kaun_ir.passes": "passes", "kaun_ir.runtime": "runtime", "kaun_ir.tools": "tools"}
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _MAP:
            return None
        folder = os.path.join(_ROOT, _MAP[name])
        return importlib.util.spec_from_file_location(
            name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
sys.meta_path.insert(0, _Finder())
EOF
    export PYTHONPATH="$WORK/shim${PYTHONPATH:+:$PYTHONPATH}"
    (cd "$WORK" && "$PY" -c 'import kaun_ir.runtime, kaun_ir.tools.cli') || return 1
    RUN_PY="$PY"
}

note "installing kaun_ir (no registry)"
if [ "${GPU_CHECK_INSTALL:-venv}" = venv ] && install_venv >"$WORK/install.log" 2>&1; then
    echo "install: editable, in a throwaway environment over $PY's packages" | tee -a "$SUMMARY"
elif install_shim >>"$WORK/install.log" 2>&1; then
    echo "install: import shim over $PY (device.log says why the environment failed)" | tee -a "$SUMMARY"
else
    cp "$WORK/install.log" "$OUT/device.log"
    echo "install: FAILED (device.log); nothing else can run" | tee -a "$SUMMARY"
    exit 1
fi

export KAUN_IR_BACKEND=$BACKEND
# every pytest worker shares one GPU: no worker may take 75% of its memory up front
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONDONTWRITEBYTECODE=1

# -------------------------------------------------------------------------------- the device
note "device"
{
    echo "== install"
    cat "$WORK/install.log"
    echo "== date: $(date -u)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo n/a)"
    echo "== nvidia-smi"
    timeout 30 nvidia-smi 2>&1 || echo "(nvidia-smi not available)"
    echo "== python packages"
    timeout 60 "$RUN_PY" - <<'EOF' 2>&1
import importlib, sys
print(sys.version)
for name in ("jax", "jaxlib", "numpy", "torch", "transformers", "optax", "safetensors", "networkx", "pytest", "xdist", "pytest_timeout"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:14s} {getattr(mod, '__version__', '?')}")
    except Exception as err:
        print(f"{name:14s} missing ({type(err).__name__})")
try:
    import torch
    print("torch.cuda.is_available():", torch.cuda.is_available())
except Exception:
    pass
EOF
    echo "== jax.devices() and one kaun_ir step"
    timeout 180 "$RUN_PY" - <<'EOF' 2>&1
import time
import jax
import numpy as np
print("jax.devices():", jax.devices())
import kaun_ir as kn
print("kaun_ir backend:", kn.runtime.backend_name())
x = np.random.default_rng(0).standard_normal((256, 256)).astype("f4")
start = time.perf_counter()
y = kn.jit(lambda a: kn.tanh(a @ a).sum())(x)
print("kn.jit first call:", f"{time.perf_counter() - start:.2f} s", "result on:", getattr(y, "devices", lambda: "?")())
ref = np.tanh(x.astype("f8") @ x.astype("f8")).sum()
print("value:", float(np.asarray(y)), "float64 NumPy:", float(ref))
EOF
    echo "== exit status $?"
} >"$OUT/device.log" 2>&1
grep -E "jax.devices|kaun_ir backend|kn.jit first|value:" "$OUT/device.log"
if grep -q "kaun_ir backend: $BACKEND" "$OUT/device.log"; then
    echo "device: ok (KAUN_IR_BACKEND=$BACKEND)" | tee -a "$SUMMARY"
else
    echo "device: FAILED to run one kaun_ir step on $BACKEND (device.log)" | tee -a "$SUMMARY"
fi

# -------------------------------------------------------------------------------- the tests
# TensorFloat-32: XLA on Ampere and later runs float32 matrix products in TF32 (10-bit mantissa)
# unless told otherwise, which the tests' float32 tolerances (set on the CPU) do not allow for.
# The test parts run without it (NVIDIA_TF32_OVERRIDE=0 reaches cuBLAS and cuDNN; XLA's own
# Triton GEMMs are turned off when this XLA knows the flag); the bench keeps XLA's defaults.
TEST_ENV=()
if [ "${GPU_CHECK_TF32:-0}" != 1 ] && [ "$BACKEND" = gpu ]; then
    TEST_ENV=(NVIDIA_TF32_OVERRIDE=0)
    FLAG="--xla_gpu_enable_triton_gemm=false"
    if XLA_FLAGS="${XLA_FLAGS:-} $FLAG" timeout 120 "$RUN_PY" -c 'import jax; jax.devices()' >/dev/null 2>&1; then
        TEST_ENV+=("XLA_FLAGS=${XLA_FLAGS:-} $FLAG")
    fi
fi
echo "test environment: ${TEST_ENV[*]:-(defaults)}" | tee -a "$SUMMARY"

PYTEST_OPTS=(-q -p no:cacheprovider -rfE --tb=short)
XDIST=
"$RUN_PY" -c 'import xdist' >/dev/null 2>&1 && XDIST=1
if "$RUN_PY" -c 'import pytest_timeout' >/dev/null 2>&1; then
    # the thread method ends a worker stuck inside XLA (a signal would wait for it to return to
    # Python); xdist reports that test as failed and starts a new worker
    PYTEST_OPTS+=(--timeout 60 --timeout-method=thread)
fi

# pytest's closing line ("3 failed, 120 passed, 2 skipped in 80.1s") as counts
pytest_counts() {
    local log=$1 rc=$2 line
    line=$(grep -E "^=*\s*[0-9]+ (passed|failed|error|errors|skipped)|no tests ran" "$log" | tail -1)
    line=$(echo "$line" | sed -E 's/^=+ //; s/ =+$//')
    if [ -z "$line" ]; then  # killed before its closing line: count the progress characters
        local dots
        dots=$(grep -E '^[.sFExX]+( +\[ *[0-9]+%\])?$' "$log" | sed -E 's/ +\[.*//' | tr -d '\n')
        line="no closing line; progress: $(echo -n "$dots" | tr -cd . | wc -c) passed, $(echo -n "$dots" | tr -cd F | wc -c) failed, $(echo -n "$dots" | tr -cd E | wc -c) errors, $(echo -n "$dots" | tr -cd s | wc -c) skipped"
    fi
    echo "$line (exit $rc$([ "$rc" = 124 ] && echo ': timed out'))"
}

# Each pytest part gets SIGINT when its time is up (pytest then still prints its counts so far),
# and SIGKILL 20 s later.
PARTS=" ${GPU_CHECK_PARTS:-tests tables torch bench} "
wanted() { [[ "$PARTS" == *" $1 "* ]]; }

run_pytest() {  # PART NAME LOG SECONDS DIST FILES...
    local name=$2 log=$3 seconds=$4 dist=$5 rc
    wanted "$1" || return 0
    shift 5
    note "$name"
    local opts=("${PYTEST_OPTS[@]}")
    [ -n "$XDIST" ] && opts+=(-n "$JOBS" --dist "$dist")
    env "${TEST_ENV[@]}" timeout -s INT -k 20 "$seconds" "$RUN_PY" -m pytest "${opts[@]}" "$@" >"$log" 2>&1
    rc=$?
    echo "$name: $(pytest_counts "$log" $rc)" | tee -a "$SUMMARY"
}

# (a) the compiler path: values against NumPy / JAX, on the GPU; whole files per worker (their
# module fixtures, the sharding test's 8-device child process, run once)
run_pytest tests "(a) compiler-path tests" "$OUT/tests.log" 120 loadfile \
    tests/test_forward.py tests/test_grad.py tests/test_vmap.py tests/test_jvp_table.py \
    tests/test_scan.py tests/test_remat.py tests/test_precision.py tests/test_sharding.py \
    tests/test_jit_runtime.py tests/test_train.py tests/test_train_multistep.py tests/test_nn.py \
    tests/test_layer.py tests/test_models_forward.py tests/test_optim.py tests/test_loss.py \
    tests/test_custom.py tests/test_linalg.py tests/test_random.py

# (a') every op's derivative and batching rule against JAX's (about 700 small programs), one test
# at a time over the workers
run_pytest tables "(a') op-table tests" "$OUT/tables.log" 60 load tests/test_vjp_table.py tests/test_vmap_table.py

# (b) real models against PyTorch (its CPU kernels are the oracle; kaun_ir runs on the GPU)
run_pytest torch "(b) torch parity" "$OUT/torch.log" 60 loadfile \
    tests/test_interop_torch_programs.py tests/test_interop_torch.py

# (c) the bench: kaun_ir's training step against the JAX + optax step (and PyTorch eager), one
# process per workload so that a slow one leaves the others' figures
bench_part() {
    : >"$OUT/bench.log"
    IFS=, read -r -a BENCH_WORKLOADS <<<"$WORKLOADS"
    for w in "${BENCH_WORKLOADS[@]}"; do
        note "(c) bench: $w"
        timeout -k 10 "${GPU_CHECK_BENCH_SECONDS:-50}" "$RUN_PY" -m kaun_ir.tools.cli bench -w "$w" --rounds 3 \
            --no-memory --no-matmul --json >"$WORK/bench-$w.json" 2>>"$OUT/bench.log"
        echo "bench $w: exit $?" >>"$OUT/bench.log"
    done
    BENCH=$("$RUN_PY" - "$OUT/bench.json" "$WORK" "${BENCH_WORKLOADS[@]}" <<'EOF' 2>>"$OUT/bench.log"
import json, os, sys
out, work, names = sys.argv[1], sys.argv[2], sys.argv[3:]
docs, parts = [], []
for name in names:
    try:
        with open(os.path.join(work, f"bench-{name}.json")) as f:
            data = json.load(f)
    except Exception as err:
        parts.append(f"{name}: no result ({type(err).__name__})")
        continue
    docs.append(data)
    for result in data.get("results", []):
        kaun = result.get("implementations", {}).get("kaun_ir", {})
        rate, ratio = kaun.get("steps_per_s"), kaun.get("ratio_vs_jax")
        parts.append(
            f"{name}: kaun_ir {rate or 0:.1f} steps/s, {ratio or 0:.2f}x JAX, "
            f"losses {'agree' if result.get('losses_agree') else 'DISAGREE'} (backend {data.get('backend')})"
        )
with open(out, "w") as f:
    json.dump(docs, f, indent=1)
print("; ".join(parts))
EOF
    )
    echo "(c) bench: ${BENCH:-no result}" | tee -a "$SUMMARY"
}
wanted bench && bench_part

# -------------------------------------------------------------------------------- summary
for f in "$OUT"/*.log "$OUT"/*.json; do  # what comes back is limited to 16 MiB a file
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && tail -c 15000000 "$f" >"$f.cut" && mv "$f.cut" "$f"
done
echo "total: $(($(date +%s) - START)) s" | tee -a "$SUMMARY"
echo "== summary ($OUT/summary.txt)"
cat "$SUMMARY"
