#!/usr/bin/env bash
# The GPU check for a CUDA machine that cannot reach a package index, whose Python already has
# jax with its CUDA plugin, diffrax, equinox, optax, rich and pytest (`nox -s gpu` needs the
# index to build its venv). Both packages run from source on PYTHONPATH. Steps, most telling
# first, each under its own time limit so that a slow one cannot starve the rest:
#   the jax probe; CPU against GPU loss and gradients (both sensitivity modes); the sensitivity
#   tests and the gpu-marked end-to-end problem on the GPU; the small-problem and bank-in-ODE
#   benchmarks; the bank's numerical tests with the GPU as default device.
# Usage: OUT=folder bash .ci/gpu_offline.sh   (about 8 minutes on an H200; the log is
# $OUT/log.txt, the agreement numbers $OUT/agreement.json)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-report}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH=$PWD/packages/confluent-bank/src:$PWD/packages/hybrid-kernels/src
PY=${PYTHON:-python3}
failed=0

step() {
    local limit=$1 start rc
    shift
    start=$(date +%s)
    echo
    echo "=== [$(date +%T)] $*"
    timeout "$limit" "$@"
    rc=$?
    [ "$rc" -ne 0 ] && failed=1
    echo "=== rc=$rc after $(($(date +%s) - start)) s: $*"
    return "$rc"
}

main() {
    nvidia-smi -L
    "$PY" -c "import sys, jax, jaxlib, diffrax, equinox, optax
print(sys.version)
print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'diffrax', diffrax.__version__,
      'equinox', equinox.__version__, 'optax', optax.__version__)
print(jax.devices())"
    step 60 "$PY" .ci/gpu_report.py check --jax || return 2
    step 100 "$PY" .ci/gpu_report.py agree --json "$OUT/agreement.json"
    export HYBRID_REQUIRE_GPU=1
    step 120 "$PY" -m pytest -q -p no:cacheprovider -rfEs \
        packages/hybrid-kernels/tests/test_sensitivity.py
    step 150 "$PY" -m pytest -q -p no:cacheprovider -rA tests-integration/test_gpu.py
    step 90 "$PY" benchmarks/small_problem.py --quick --runs 1
    step 90 "$PY" benchmarks/bank_in_ode.py --quick
    (cd packages/confluent-bank/tests && step 120 "$PY" -m pytest -q -p no:cacheprovider -rfEs \
        test_activations.py test_forward_pair_branch.py test_forward_series.py test_moments.py \
        test_infinite_input.py test_float32.py test_vectorised.py) || failed=1
    return "$failed"
}

main 2>&1 | tee "$OUT/log.txt"
status=${PIPESTATUS[0]}
echo "gpu_offline: log in $OUT/log.txt"
exit "$status"
