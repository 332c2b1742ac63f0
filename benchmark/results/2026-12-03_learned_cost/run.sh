#!/usr/bin/env bash
# The learned-cost policy on Llama-3.1-8B shapes with random weights and simulated acceptance, k_max = 3,
# on one H200. Every part starts its servers at once and measures them in turn, rounds in rotating order.
#   a: 128-token prompts, 512 output tokens, accept length 1.5 (where the start-up table chose k = 1
#      over plain decoding at batch 256), concurrency 1, 16, 64: no draft, its A/A twin, k = 1, dynamic.
#   b: the same load at concurrency 256: no draft, k = 1, dynamic with KV for 128K tokens each (three 8B
#      servers with KV for 256 x 640 tokens do not fit: 170K each ran out of memory), so requests are retracted.
#   b2: concurrency 256, no draft and dynamic, KV for 180K tokens each (no retraction).
#   c: a time-varying trace (trace.json: concurrency 1 -> 256 -> 16 -> 128 -> 1, requests of accept
#      length 3.0 and 1.4 in a shifting mix): no draft, always k = 3, dynamic, 2 rounds.
# Usage (GPU machine, repository root): PARTS="a b c" bash benchmark/results/2026-12-03_learned_cost/run.sh OUT
set -u -o pipefail
OUT=${1:?usage: run.sh OUT}
HERE=$(dirname "$0")
export INPUT_LEN=128 OUTPUT_LEN=512 NUM_PROMPTS=2 PER_CONC=1 SWEEP_TIMEOUT_S=150 HEALTH_DEADLINE_S=400
for part in ${PARTS:-a b c}; do
  mkdir -p "$OUT/$part"
  case $part in
    a) ROUNDS=3 LEVELS=1,16,64 KV_TOKENS=50000 timeout 370 bash benchmark/spec_envelope_gpu.sh "$OUT/a" 8b-acc1.5 \
         no_draft no_draft_b k1 dynamic
       python -m sglang.benchmark.envelope --dynamic "$OUT/a/8b-acc1.5_dynamic.jsonl" \
         --static no_draft="$OUT/a/8b_no_draft.jsonl" --static k1="$OUT/a/8b-acc1.5_k1.jsonl" \
         --aa no_draft="$OUT/a/8b_no_draft_b.jsonl" --out "$OUT/a/report.json" ;;
    b) ROUNDS=3 LEVELS=256 KV_TOKENS=128000 PORT=30100 timeout 300 bash benchmark/spec_envelope_gpu.sh "$OUT/b" \
         8b-acc1.5 no_draft k1 dynamic
       python -m sglang.benchmark.envelope --dynamic "$OUT/b/8b-acc1.5_dynamic.jsonl" \
         --static no_draft="$OUT/b/8b_no_draft.jsonl" --static k1="$OUT/b/8b-acc1.5_k1.jsonl" --out "$OUT/b/report.json" ;;
    b2) ROUNDS=3 LEVELS=256 KV_TOKENS=180000 PORT=30150 timeout 300 bash benchmark/spec_envelope_gpu.sh "$OUT/b2" \
         8b-acc1.5 no_draft dynamic
       python -m sglang.benchmark.envelope --dynamic "$OUT/b2/8b-acc1.5_dynamic.jsonl" \
         --static no_draft="$OUT/b2/8b_no_draft.jsonl" --out "$OUT/b2/report.json" ;;
    c) ROUNDS=2 TRACE=$HERE/trace.json KV_TOKENS=128000 PORT=30200 SWEEP_TIMEOUT_S=200 timeout 480 \
         bash benchmark/spec_envelope_gpu.sh "$OUT/c" 8b-acc3 no_draft always dynamic
       python -m sglang.benchmark.envelope --dynamic "$OUT/c/8b-acc3_dynamic.jsonl" \
         --static no_draft="$OUT/c/8b_no_draft.jsonl" --static always="$OUT/c/8b-acc3_always.jsonl" --out "$OUT/c/report.json" ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.csv" 2>&1
