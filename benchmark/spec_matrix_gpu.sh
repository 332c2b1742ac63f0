#!/usr/bin/env bash
# Dynamic speculation against the static servers on steady loads, k_max = 3, one GPU. PAIR: the model pair
# (8b: Llama-3.1-8B shapes, the default; or any make_random_model config, e.g. qwen3-30b-a3b-8l for MoE shapes).
# Four servers up at once (no draft; always k = 3; k = 1 on every step; dynamic), measured in turn, ROUNDS
# rounds in rotating order (interleaved_sweep.py), one load after another on the same servers. Each
# request asks for its load's accept length (--accept-length-mix ACC:1; the speculative servers run with
# SGLANG_SIMULATE_ACC_LEN), so one set of servers serves every load. Four 8B servers fit one H200 with
# KV for about 45K tokens each, so each load's levels stop where concurrency x (input + output) fits.
# LOADS: "NAME:INPUT:OUTPUT:ACCEPT:LEVELS ..." (default the three loads below). NAMES: the servers (default
# "no_draft always k1 dynamic"; a name ending in _b is its kind's A/A twin, dynamic_x dynamic with dense
# exploration). STAGGER=1: servers start one after another (see below). LOAD_FORMAT=dummy: random weights drawn by each server, nothing written. COST_LOG=1: each speculative server writes its cost log (SGLANG_SPEC_COST_LOG). Everything lands in
# OUT/matrix.tgz; OUT/summary.txt has every level's pooled tok/s, each server's spread between rounds
# and the envelope report's verdicts; OUT/prefill_passes.txt each server's kept prefill graphs and what
# closed its prefill passes (with EXTRA_SERVER_ARGS="--log-level debug").
# Usage (GPU machine, repository root): bash benchmark/spec_matrix_gpu.sh OUT
set -u -o pipefail
OUT=${1:?usage: spec_matrix_gpu.sh OUT}
ROUNDS=${ROUNDS:-3} KV=${KV_TOKENS:-45000} BASE=${PORT:-30400}
LOADS=${LOADS:-"in128_out512_acc2.5:128:512:2.5:1,4,16,64 in1024_out128_acc2.0:1024:128:2.0:1,4,16,32 in2048_out256_acc3.0:2048:256:3.0:1,4,16"}
RAW=$OUT/raw
mkdir -p "$RAW"
source benchmark/serve_lib.sh
if [ -z "${MODEL:-}" ]; then  # MODEL / DRAFT / EXTRA_SERVER_ARGS: overrides for a dry run
  WEIGHTS=True; [ "${LOAD_FORMAT:-}" = dummy ] && WEIGHTS=False  # dummy: no 16 GB of random weights written
  read -r MODEL DRAFT < <(python -c "from sglang.benchmark.speculative_levels import make_pair; print(*make_pair('${PAIR:-8b}', '/tmp/spec_envelope', weights=$WEIGHTS))" | tail -1)
fi
[ -n "${MODEL:-}" ] && [ -n "${DRAFT:-}" ] || { echo "no model pair"; exit 1; }
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3"
read -r -a NAMES <<< "${NAMES:-no_draft always k1 dynamic}"
# STAGGER=1: each server sees the others' memory as used, and the default --mem-fraction-static (0.85)
# would keep 15% of the card back from what is left; each keeps 5% back instead (their KV is capped by
# KV_TOKENS either way), unless EXTRA_SERVER_ARGS says otherwise.
STAGGER_ARGS=""
if [ "${STAGGER:-0}" = 1 ] && [[ "${EXTRA_SERVER_ARGS:-}" != *--mem-fraction-static* ]]; then
  STAGGER_ARGS="--mem-fraction-static 0.95"
fi
declare -A ARGS=([no_draft]="" [always]="$SPEC" [k1]="$SPEC --speculative-adaptive --speculative-candidate-steps 1"
                 [dynamic]="$SPEC --speculative-adaptive" [dynamic_x]="$SPEC --speculative-adaptive")
for name in "${!ARGS[@]}"; do ARGS[${name}_b]=${ARGS[$name]}; done
PIDS=()
trap 'kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null' EXIT
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  [ -n "${ARGS[$name]+set}" ] || { echo "unknown server $name"; exit 1; }
  ENV=(SGLANG_SIMULATE_ACC_LEN=2.0)
  [ "$name" = dynamic_x ] && ENV+=(SGLANG_SPEC_EXPLORE_EVERY=${EXPLORE_EVERY:-24})
  [ "${COST_LOG:-0}" = 1 ] && [ -n "${ARGS[$name]}" ] && ENV+=(SGLANG_SPEC_COST_LOG=$RAW/$name.costlog)
  env "${ENV[@]}" python -m sglang.launch_server --model-path "$MODEL" --port $((BASE + i)) \
    --max-running-requests 256 --max-total-tokens "$KV" ${ARGS[$name]} ${LOAD_FORMAT:+--load-format $LOAD_FORMAT} $STAGGER_ARGS ${EXTRA_SERVER_ARGS:-} > "$RAW/$name.server.log" 2>&1 &
  PIDS+=($!)
  # STAGGER=1: the next server starts once this one is up, so no server's start-up timings (its step
  # table, which prefill graphs beat eager launches) are taken while another loads the GPU.
  if [ "${STAGGER:-0}" = 1 ]; then wait_healthy "$!" $((BASE + i)) "$RAW/$name.server.log" 400 || exit 1; fi
done
echo "== $(date +%T) starting ${NAMES[*]}"
for i in "${!NAMES[@]}"; do
  wait_healthy "${PIDS[$i]}" $((BASE + i)) "$RAW/${NAMES[$i]}.server.log" 400 || exit 1
done
{ nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; } > "$RAW/memory.txt" 2>&1
SERVERS=()
for i in "${!NAMES[@]}"; do SERVERS+=("--server=${NAMES[$i]}=http://127.0.0.1:$((BASE + i))"); done
start_monitor "$RAW/monitor"
for load in $LOADS; do
  IFS=: read -r lname input output acc levels <<< "$load"
  echo "== $(date +%T) $lname: levels $levels"
  mkdir -p "$RAW/$lname"
  timeout "${LOAD_TIMEOUT_S:-300}" python benchmark/interleaved_sweep.py "${SERVERS[@]}" --rounds "$ROUNDS" \
    --out-dir "$RAW/$lname" --dataset-name random --random-input-len "$input" --random-output-len "$output" \
    --random-range-ratio 1 --num-prompts 2 --prompts-per-concurrency 1 --max-concurrency "$levels" \
    --accept-length-mix "$acc:1" --warmup-requests 8 --flush-cache --disable-tqdm | grep -E "^concurrency"
  STATICS=()
  for name in "${NAMES[@]}"; do
    case $name in
      dynamic*) ;;
      *_b) STATICS+=(--aa "${name%_b}=$RAW/$lname/$name.jsonl") ;;
      *) STATICS+=(--static "$name=$RAW/$lname/$name.jsonl") ;;
    esac
  done
  python -m sglang.benchmark.envelope --dynamic "$RAW/$lname/dynamic.jsonl" "${STATICS[@]}" --out "$RAW/$lname/report.json" \
    > "$RAW/$lname/report.txt" 2>&1
  for i in "${!NAMES[@]}"; do save_server_info $((BASE + i)) "$RAW/$lname/${NAMES[$i]}.server_info.json"; done
done
stop_monitor
python -m sglang.benchmark.matrix_summary "$RAW" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
if compgen -G "$RAW/*.costlog.*.txt" > /dev/null; then
  python -m sglang.benchmark.cost_log_report "$RAW"/*.costlog.*.txt > "$OUT/cost_report.txt" 2>&1
  tail -40 "$OUT/cost_report.txt"
fi
# Each server's prefill graphs as kept at start-up, and (--log-level debug) how often each limit closed a prefill pass.
for name in "${NAMES[@]}"; do
  echo "== $name"
  grep -h "prefill CUDA graphs" "$RAW/$name.server.log"
  grep -ho "kept to this size by the .*" "$RAW/$name.server.log" | sort | uniq -c
done > "$OUT/prefill_passes.txt" 2>&1
(cd "$OUT" && tar czf matrix.tgz raw && rm -rf raw)
