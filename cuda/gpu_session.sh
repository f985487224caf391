#!/usr/bin/env bash
# One lease of a lent GPU machine: build pycuda, run the GPU tests and the GPU benchmarks.
#
# Run from a copy of the repository (no .git needed) with $OUT set to a folder whose files
# come back; the wheels and the pycuda sdist lie in $WHEELS (default ../wheels):
#     FOVEA_GIT_COMMIT=<sha> OUT=/tmp/out bash cuda/gpu_session.sh [--dry-run]
# --dry-run (on a machine without a GPU) only checks that every step's command exists.
# The benchmarks write _build/benchmarks/*.json (copied to $OUT); back home, record them with
#     .venv/bin/python -m fovea_book.bench promote <files_at>/sampling_gpu.json ...
# which refuses a record that measured less than the committed one (or was taken loaded).
# Steps run so that the CPU-heavy pycuda build overlaps the GPU-heavy VLM prefill.
set -uo pipefail
DRY=${1:-}
OUT=${OUT:?set OUT}
WHEELS=${WHEELS:-$(cd .. && pwd)/wheels}
PY=${PY:-python3}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PIP_DEPS=/tmp/fovea_pydeps
mkdir -p "$OUT" "$PIP_DEPS"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }

log "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available())"
  nvcc --version | tail -2
  $PY -c "import sysconfig, os; p = sysconfig.get_paths()['include']; print('Python.h', os.path.exists(os.path.join(p, 'Python.h')), p)"
} 2>&1 | tee -a "$OUT/session.log"
[ "$DRY" = "--dry-run" ] && { log "dry run: commands found"; exit 0; }

log "pure-python deps of pycuda -> $PIP_DEPS"
$PY -m pip install --quiet --no-index --no-deps --target "$PIP_DEPS" "$WHEELS"/*.whl \
    >>"$OUT/session.log" 2>&1
export PYTHONPATH=$PYTHONPATH:$PIP_DEPS

log "pycuda build (background)"
(
  set -e
  rm -rf /tmp/pycuda && mkdir -p /tmp/pycuda && tar xzf "$WHEELS"/pycuda-*.tar.gz -C /tmp/pycuda
  cd /tmp/pycuda/pycuda-*
  $PY configure.py --cuda-root=/usr/local/cuda --no-cuda-enable-curand
  $PY setup.py build_ext --inplace -j 16
) >"$OUT/pycuda_build.log" 2>&1 &
PYCUDA_PID=$!

log "VLM prefill (bf16, Qwen2-VL-2B LM, random weights; batches 1, 8, 32; the pipeline)"
$PY -m fovea_book.bench vlm_latency --no-cpu --gpu-models qwen2-vl-2b \
    --gpu-tokens 273 576 1024 4096 --gpu-batches 1 8 32 --cuda-graph --pipeline \
    --name vlm_latency_gpu >"$OUT/vlm.log" 2>&1
tail -3 "$OUT/vlm.log"
cp _build/benchmarks/vlm_latency_gpu.json "$OUT/" 2>/dev/null

log "wait for pycuda"
if wait $PYCUDA_PID; then
  export PYTHONPATH=$PYTHONPATH:$(ls -d /tmp/pycuda/pycuda-*)
  $PY -c "import pycuda.driver as d; d.init(); print('pycuda', d.get_version(), d.Device(0).name())" \
      2>&1 | tee -a "$OUT/session.log"
else
  log "pycuda build FAILED (tail of the log follows)"; tail -20 "$OUT/pycuda_build.log"
fi

log "GPU tests"
$PY -m pytest -m gpu -q -rA tests/test_kernels.py tests/test_kernels_fused.py tests/test_allocators_device.py -p no:cacheprovider \
    >"$OUT/pytest_gpu.log" 2>&1
tail -25 "$OUT/pytest_gpu.log"

log "nvcc resource usage"
$PY -c "import json; from fovea_book.kernel_source import kernel_resources; print(json.dumps({a: kernel_resources(a) for a in ('sm_80', 'sm_90')}))" \
    >"$OUT/resources.json" 2>>"$OUT/session.log"

log "sampling benchmark (B = 1, 64)"
$PY -m fovea_book.bench sampling --gpu-only --gpu-batches 1 64 >"$OUT/sampling.log" 2>&1
tail -12 "$OUT/sampling.log"
cp _build/benchmarks/sampling_gpu.json "$OUT/" 2>/dev/null
log "ncu: DRAM traffic of the gather kernel (B = 64)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 240 "$NCU" --target-processes all -k regex:'gather_(patches|tokens)' --launch-skip 1 --launch-count 16 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
      $PY -m fovea_book.bench gather_probe >"$OUT/ncu_gather.txt" 2>&1
  grep -E "gather_|gpu__time|dram__|warps_active|registers" "$OUT/ncu_gather.txt" | head -30
else
  log "ncu not found"
fi
# at most 8 files come back: the long logs travel as one archive
tar czf "$OUT/logs.tgz" -C "$OUT" pycuda_build.log vlm.log sampling.log 2>/dev/null \
  && rm -f "$OUT/pycuda_build.log" "$OUT/vlm.log" "$OUT/sampling.log"
log "done"
