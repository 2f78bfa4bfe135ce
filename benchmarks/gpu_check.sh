#!/usr/bin/env bash
# The GPU check of issue 15, in one call on the GPU machine (one H200; Python 3.12, PyTorch
# 2.11 + CUDA 13, numpy, pyarrow, tokenizers, tqdm, pytest; no pydantic, Prefect, Great
# Expectations or lakeFS SDK, none of which this needs). Prepared and dry-run on a CPU machine.
#
#   1. installs the wheels in .whl/ (benchmarks/gpu_wheels.sh fetches them; carry ".whl");
#   2. records the machine (GPU, driver, torch) and checks that nothing imported pulls in
#      Prefect, Great Expectations or lakeFS;
#   3. runs tests/training/test_cuda.py, the quick training tests (not marked slow) and the
#      FSDP test of tests/training/test_distributed.py (2 ranks on 1 GPU: gloo on the CPU);
#   4. runs benchmarks/gpu_train.py for gpt2-124m, gpt2-350m and gpt2-774m, one process each.
#
# Everything lands in $OUT (env.txt, tests.log, bench.log, gpu_train.json, summary.txt); the
# last lines printed are the summary. A stage that fails does not stop the later ones; the
# exit status is the first failure's. Stages are bounded so that the whole stays under 8
# minutes (GPU_CHECK_BUDGET_S, default 470 s); a benchmark that would start with too little
# time left is skipped, saying so (run it in a second call: GPU_CHECK_SKIP_TESTS=1
# GPU_CHECK_PRESETS=gpt2-774m). From the repository root on this machine:
#
#     benchmarks/gpu_wheels.sh
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
#
# Knobs (environment): GPU_CHECK_LEVERS (gpu_train.py options for every preset),
# GPU_CHECK_PRESETS (default "gpt2-124m gpt2-350m gpt2-774m"), GPU_CHECK_SKIP_TESTS=1.
# GPU_CHECK_SMOKE=1 is the CPU dry run: the benchmark runs in its --smoke mode instead.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
OUT=${OUT:-$(mktemp -d -t gpu-check-XXXX)}
PYTHON=${PYTHON:-python3}
LEVERS=${GPU_CHECK_LEVERS:---micro-batch auto --loss-chunk-tokens 8192 --compile-scope blocks --sync-every 5 --ckpt-every 10}
PRESETS=${GPU_CHECK_PRESETS:-gpt2-124m gpt2-350m gpt2-774m}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
status=0
fail() { [ "$status" -ne 0 ] || status=$1; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
note() { echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }

# 1. packages the machine lacks, from the carried wheels, ahead of the image's own
WHEELS=${GPU_CHECK_WHEELS:-.whl}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d -t gpu-site-XXXX)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
        || { note "installing $WHEELS/*.whl failed"; exit 3; }
    export PYTHONPATH="$SITE:$PWD"
else
    note "no .whl/ here: using the interpreter's own packages (run benchmarks/gpu_wheels.sh first for the GPU machine)"
    export PYTHONPATH="$PWD"
fi

# 2. the machine, and an import audit of what the tests and the benchmark load
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
    "$PYTHON" - <<'EOF'
import importlib, sys
sys.path.insert(0, "benchmarks")
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "devices", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
for name in ("training.trainer", "training.__main__", "tests.training.test_cuda", "tests.training.test_distributed",
             "tests.training.test_staging", "gpu_train"):
    importlib.import_module(name)
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"prefect", "great_expectations", "lakefs", "lakefs_sdk", "flows", "tasks"})
print("import audit:", "clean" if not loaded else f"LOADED {loaded}")
sys.exit(1 if loaded else 0)
EOF
} >"$OUT/env.txt" 2>&1 || { fail 4; note "environment or import audit failed: see env.txt"; }
tail -n 2 "$OUT/env.txt" | tee -a "$OUT/summary.txt"

# 3. tests: CUDA, the quick training tests, and the 2-rank FSDP job on a 1-GPU machine
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != 1 ]; then
    timeout $(( $(left) < 230 ? $(left) : 230 )) "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
        tests/training/test_cuda.py \
        tests/training/test_staging.py tests/training/test_losses.py tests/training/test_checkpoint.py \
        tests/training/test_model.py tests/training/test_data.py tests/training/test_lineage_and_stability.py \
        tests/training/test_imports.py \
        "tests/training/test_distributed.py::test_fsdp2_trains_on_cpu_and_resumes_exactly" \
        >"$OUT/tests.log" 2>&1 || { fail 5; note "tests failed or ran out of time: see tests.log"; }
    grep -E "passed|failed|error|SKIPPED|UserWarning" "$OUT/tests.log" | tail -n 12 | tee -a "$OUT/summary.txt"
fi

# 4. the benchmark, one process per preset; each preset's entry is written as soon as it is done
# seconds a preset needs (compilation, three runs, checkpoints of 1.5, 4.3 and 9.3 GB), and its steps
need_s() { case "$1" in gpt2-124m) echo 110 ;; gpt2-350m) echo 80 ;; *) echo 115 ;; esac; }
steps_for() { case "$1" in gpt2-124m) echo "--warmup 10 --window 30" ;; *) echo "--warmup 5 --window 10" ;; esac; }
for preset in $PRESETS; do
    if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
        args="--smoke"
    else
        args="--presets $preset $(steps_for "$preset") $LEVERS"
        if [ "$(left)" -lt "$(need_s "$preset")" ]; then
            note "skipping $preset: $(left) s left, it needs about $(need_s "$preset") s"
            fail 6
            continue
        fi
    fi
    note "benchmark: gpu_train.py $args"
    # shellcheck disable=SC2086
    timeout "$(left)" "$PYTHON" benchmarks/gpu_train.py $args --out "$OUT/gpu_train.json" >>"$OUT/bench.log" 2>&1 \
        || { fail 7; note "$preset failed or ran out of time: see bench.log"; }
    grep -E "^gpu_train\[" "$OUT/bench.log" | tail -n 1 | tee -a "$OUT/summary.txt"
    [ "${GPU_CHECK_SMOKE:-0}" = 1 ] && break
done

note "done in $(($(date +%s) - START)) s, status $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
grep -E "^gpu_train: " "$OUT/bench.log" 2>/dev/null | head -n 1
exit "$status"
