#!/usr/bin/env bash
# The next GPU session's device calls, one part per call (each fits the 600 s limit of a call).
# Run from the repository root on the GPU machine, after `source .device/env.sh`:
#
#   bash benchmark/gpu_session.sh PART $OUT
#
# correctness  starts the demo pipeline twice in the background (setsid: it outlives the call;
#              GPU-light, ~13 min), then the GPU tests (kernels, sampling, speculative graphs)
#              and benchmark/spec_gpu_check.py (lossless checks, bf16 match rate)
# collect      waits for the pipeline and returns its packed results (call right after
#              `correctness`: the machine is kept only ~30 s between calls)
# timing       nothing else on the GPU: spec_speed on the demo pair (k 3 and 5, whole-step graph
#              on and off), overlap_busy on 8B shapes, gpu_check floor / bench / profile
# serving      the bench_serving sweep on 8B shapes (concurrency 1..256, plot) and spec_speed
#              on 8B shapes with a random draft
# gptfast      gpt-fast at batch 8 (its compile alone takes ~130 s); carry .peers
#
# Every part writes logs and JSON under $OUT (at most 8 files come back per call).
set -u -o pipefail
PART=${1:?usage: gpu_session.sh PART OUT}
OUT=${2:?usage: gpu_session.sh PART OUT}
WORK=/tmp/gpu_session
mkdir -p "$OUT" "$WORK"
{ git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; } > "$OUT/run_info_$PART.txt"
MODEL_8B=/tmp/gpu_check/llama-3.1-8b

ensure_8b() {
  [ -f "$MODEL_8B/model.safetensors.index.json" ] || \
    python -m sglang.tools.make_random_model "$MODEL_8B" --config llama-3.1-8b --device cuda
}

case "$PART" in
  correctness)
    (DEMO_WORK=/tmp/demo_runs setsid scripts/demo_models/run_twice_on_gpu.sh >"$WORK/demo_driver.log" 2>&1 &)
    timeout 300 python -m pytest test/gpu -q -x 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
    timeout 200 python benchmark/spec_gpu_check.py --out "$OUT" 2>&1 | grep -v Warning | tail -40 \
      | tee "$OUT/spec_gpu_check.log"
    ;;
  collect)
    for _ in $(seq 1 560); do [ -f /tmp/demo_runs/done ] && break; sleep 1; done
    grep -h "\[pipeline\]" /tmp/demo_runs/a.log /tmp/demo_runs/b.log
    cp /tmp/demo_runs/ret/* "$OUT"/ 2>/dev/null || echo "pipeline not done yet"
    ;;
  timing)
    ensure_8b
    timeout 240 python benchmark/spec_speed.py --pair demo --batch-sizes 1,4,16,64,256 --steps 3,5 \
      --out "$OUT/spec_demo.json" 2>&1 | tail -20
    timeout 90 python benchmark/spec_speed.py --pair demo --batch-sizes 1,16 --steps 3 --disable-step-graph \
      --out "$OUT/spec_demo_per_forward.json" 2>&1 | tail -6
    timeout 120 python benchmark/overlap_busy.py --model-path "$MODEL_8B" --out "$OUT/overlap_busy.json" 2>&1 | tail -4
    timeout 120 python benchmark/gpu_check.py --out "$OUT" --parts floor,bench,profile 2>&1 | tail -12
    ;;
  serving_collect)
    # The serving sweep has no speed goal (#7 asks for one recorded run), so it may share the GPU
    # with the pipeline started by `correctness`; then the pipeline's results are collected.
    ensure_8b
    SWEEP_TIMEOUT_S=300 timeout 400 bash benchmark/serving_sweep_gpu.sh "$OUT" "$MODEL_8B" 2>&1 | tail -30
    for _ in $(seq 1 150); do [ -f /tmp/demo_runs/done ] && break; sleep 1; done
    grep -h "\[pipeline\]" /tmp/demo_runs/a.log /tmp/demo_runs/b.log | tail -30
    cp /tmp/demo_runs/ret/* "$OUT"/ 2>/dev/null || echo "pipeline not done yet"
    ;;
  serving)
    ensure_8b
    SWEEP_TIMEOUT_S=300 timeout 400 bash benchmark/serving_sweep_gpu.sh "$OUT" "$MODEL_8B" 2>&1 | tail -30
    timeout 150 python benchmark/spec_speed.py --pair 8b --batch-sizes 1,8,64,256 --steps 3 \
      --out "$OUT/spec_8b.json" 2>&1 | tail -10
    ;;
  gptfast)
    timeout 500 python benchmark/peer_gpt_fast.py --gpt-fast-dir .peers/gpt-fast --batch-sizes 8 --input-len 1024 \
      --steps 128 --out "$OUT/peer_gpt_fast_bs8.json" 2>&1 | tail -10
    ;;
  *)
    echo "unknown part $PART (correctness, collect, timing, serving, serving_collect, gptfast)"; exit 2 ;;
esac
