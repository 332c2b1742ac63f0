#!/usr/bin/env bash
# The learned-cost policy on the load where the start-up table chose wrongly: Llama-3.1-8B shapes,
# random weights, SGLANG_SIMULATE_ACC_LEN=1.5, 128-token prompts, 512 output tokens, k_max = 3.
# Part A: concurrency 1, 16, 64 with no draft, its A/A twin, k = 1 every step and dynamic, all up
# at once, 3 rounds each in rotating order. Part B: concurrency 256 with no draft, k = 1 and dynamic
# (four 8B servers with KV for 256 x 640 tokens do not fit one H200).
# Usage (GPU machine, from the repository root): bash benchmark/results/2026-12-03_learned_cost/run.sh OUT
set -u -o pipefail
OUT=${1:?usage: run.sh OUT}
mkdir -p "$OUT/a" "$OUT/b"
export ROUNDS=3 INPUT_LEN=128 OUTPUT_LEN=512 NUM_PROMPTS=2 PER_CONC=1 SWEEP_TIMEOUT_S=150 HEALTH_DEADLINE_S=400
report() {  # DIR [AA]
  python -m sglang.benchmark.envelope --dynamic "$1/8b-acc1.5_dynamic.jsonl" --static no_draft="$1/8b_no_draft.jsonl" \
    --static k1="$1/8b-acc1.5_k1.jsonl" ${2:+--aa no_draft="$1/8b_no_draft_b.jsonl"} --out "$1/report.json"
}
LEVELS=1,16,64 KV_TOKENS=50000 timeout 370 bash benchmark/spec_envelope_gpu.sh "$OUT/a" 8b-acc1.5 no_draft no_draft_b k1 dynamic
report "$OUT/a" aa
LEVELS=256 KV_TOKENS=170000 PORT=30100 timeout 215 bash benchmark/spec_envelope_gpu.sh "$OUT/b" 8b-acc1.5 no_draft k1 dynamic
report "$OUT/b"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.csv" 2>&1
