#!/usr/bin/env bash
# Issue 27, batch 256: does a plain step cost a server whose requests the draft follows more than it
# costs a server without a draft? Llama-3.1-8B shapes, random weights, SGLANG_SIMULATE_ACC_LEN=ACC,
# k_max = 3; 128-token prompts, 256 output tokens (ignore_eos, greedy), concurrency 256, 2 requests
# per unit of concurrency a round. Two groups of servers, one no-draft server up through both
# (five 8B servers with KV for 256 x 384 tokens do not fit one H200):
#   A: no_draft; plain_warm (policy never, SGLANG_DRAFT_FOLLOWS_ALL=1, draft sync warm: every step the
#      plain step of requests the draft follows, the cost policy's k = 0); plain_catch_up (the same
#      with --speculative-draft-sync catch-up: the target with aux states kept, no draft forward).
#   B: no_draft; k1 (k = 1 on every step); dynamic (--speculative-adaptive, the default policy).
#   C (PROBE_GROUPS="c"): no_draft; no_draft_b (its twin: the A/A spread); dynamic.
# PROBE_GROUPS: which groups run (default "a b"). Each group: servers measured in turn, ROUNDS rounds in rotating order (interleaved_sweep.py); every
# scheduler times its steps (SGLANG_STEP_TIMES, one table per busy period). Everything lands in
# OUT/probe.tgz; OUT/summary.txt has the throughputs, the step tables at batch 129-256 and dynamic's
# learned costs.
# Usage (GPU machine, repository root): bash benchmark/results/2026-12-04_batch256_probe/run.sh OUT
set -u -o pipefail
OUT=${1:?usage: run.sh OUT}
ACC=${ACC:-1.5} KV=${KV_TOKENS:-110000} ROUNDS=${ROUNDS:-2} BASE=${PORT:-30300}
RAW=$OUT/raw
mkdir -p "$RAW/steps"
source benchmark/serve_lib.sh
# MODEL / DRAFT, CONC, OUTPUT_LEN, EXTRA_SERVER_ARGS: overrides for a dry run (e.g. the demo pair on the CPU).
if [ -z "${MODEL:-}" ]; then
  read -r MODEL DRAFT < <(python -c "from sglang.benchmark.speculative_levels import make_pair; print(*make_pair('8b', '/tmp/spec_envelope'))" | tail -1)
fi
[ -n "${MODEL:-}" ] && [ -n "${DRAFT:-}" ] || { echo "no model pair"; exit 1; }
CONC=${CONC:-256} OUTPUT_LEN=${OUTPUT_LEN:-256}
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3"
SIM=SGLANG_SIMULATE_ACC_LEN=$ACC
declare -A PID PORT_OF
launch() {  # NAME PORT ENV... -- ARGS...
  local name=$1 port=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" SGLANG_STEP_TIMES="$RAW/steps/$name" python -m sglang.launch_server --model-path "$MODEL" \
    --port "$port" --max-running-requests 256 --max-total-tokens "$KV" "$@" ${EXTRA_SERVER_ARGS:-} > "$RAW/$name.server.log" 2>&1 &
  PID[$name]=$! PORT_OF[$name]=$port
}
wait_all() {  # NAME...: 0 if every one answers /health
  local ok=0
  for name in "$@"; do
    wait_healthy "${PID[$name]}" "${PORT_OF[$name]}" "$RAW/$name.server.log" 300 || ok=1
  done
  return $ok
}
memory() {  # LABEL: per-process GPU memory
  { echo "== $1"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; } >> "$RAW/memory.txt" 2>&1
  for name in "${!PID[@]}"; do echo "$name ${PID[$name]} children $(pgrep -P "${PID[$name]}" | tr '\n' ' ')"; done >> "$RAW/memory.txt"
}
measure() {  # GROUP NAME...: the interleaved rounds at concurrency 256
  local group=$1; shift
  local servers=()
  for name in "$@"; do servers+=("--server=$name=http://127.0.0.1:${PORT_OF[$name]}"); done
  echo "== $(date +%T) group $group: $*"
  timeout 240 python benchmark/interleaved_sweep.py "${servers[@]}" --rounds "$ROUNDS" --out-dir "$RAW/$group" \
    --dataset-name random --random-input-len 128 --random-output-len "$OUTPUT_LEN" --random-range-ratio 1 \
    --num-prompts 2 --prompts-per-concurrency 2 --max-concurrency "$CONC" --warmup-requests 8 --flush-cache \
    --disable-tqdm | grep -E "^concurrency"
  for name in "$@"; do save_server_info "${PORT_OF[$name]}" "$RAW/$group/$name.server_info.json"; done
}
stop() {  # NAME...
  for name in "$@"; do kill "${PID[$name]}" 2>/dev/null; done
  for name in "$@"; do wait "${PID[$name]}" 2>/dev/null; unset "PID[$name]"; done
}
trap 'kill ${PID[@]} 2>/dev/null; wait 2>/dev/null' EXIT
PROBE_GROUPS=" ${PROBE_GROUPS:-a b} "
mkdir -p "$RAW/a" "$RAW/b" "$RAW/c"
launch no_draft $BASE --
if [[ $PROBE_GROUPS == *" a "* ]]; then
echo "== $(date +%T) starting group A"
launch plain_warm $((BASE + 1)) $SIM SGLANG_DRAFT_FOLLOWS_ALL=1 -- $SPEC --speculative-policy never --speculative-draft-sync warm
launch plain_catch_up $((BASE + 2)) $SIM SGLANG_DRAFT_FOLLOWS_ALL=1 -- $SPEC --speculative-policy never --speculative-draft-sync catch-up
wait_all no_draft plain_warm plain_catch_up && { memory "group A up"; measure a no_draft plain_warm plain_catch_up; }
stop plain_warm plain_catch_up
for _ in $(seq 30); do  # their memory back before group B starts
  (( $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l) <= 1 )) && break; sleep 1
done
fi
if [[ $PROBE_GROUPS == *" b "* ]]; then
echo "== $(date +%T) starting group B"
launch k1 $((BASE + 3)) $SIM -- $SPEC --speculative-adaptive --speculative-candidate-steps 1
launch dynamic $((BASE + 4)) $SIM -- $SPEC --speculative-adaptive
wait_all no_draft k1 dynamic && { memory "group B up"; measure b no_draft k1 dynamic; }
stop k1 dynamic
fi
if [[ $PROBE_GROUPS == *" c "* ]]; then  # dynamic against no draft with an A/A pair of no-draft servers
echo "== $(date +%T) starting group C"
launch no_draft_b $((BASE + 5)) --
launch dynamic $((BASE + 4)) $SIM -- $SPEC --speculative-adaptive
wait_all no_draft no_draft_b dynamic && { memory "group C up"; measure c no_draft no_draft_b dynamic; }
fi
memory "end"
stop "${!PID[@]}"
python benchmark/results/2026-12-04_batch256_probe/summarize.py "$RAW" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
(cd "$OUT" && tar czf probe.tgz raw && rm -rf raw)
