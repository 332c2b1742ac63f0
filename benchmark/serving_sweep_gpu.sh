#!/usr/bin/env bash
# The recorded serving sweep (docs/bench_serving.md, "The recorded GPU run"), on the GPU machine:
#
#   bash benchmark/serving_sweep_gpu.sh OUT_DIR [MODEL_DIR]
#
# Serves MODEL_DIR (default /tmp/gpu_check/llama-3.1-8b; made with random Llama-3.1-8B weights when
# missing) with --max-running-requests 256, waits for /health (deadline: HEALTH_DEADLINE_S, 300 s),
# sweeps --max-concurrency 1..256 at input 1024 / output 128 into OUT_DIR/$NAME.jsonl, plots
# OUT_DIR/$NAME.png, and stops the server (also on error). The plot is drawn from whatever levels
# were written, also when the sweep stopped early (SWEEP_TIMEOUT_S bounds the sweep; 0 = none).
# Env: NAME (bench_serving_8b), PORT (30000), LABEL, HEALTH_DEADLINE_S, SWEEP_TIMEOUT_S,
# SERVER_ARGS (extra launch_server flags), INPUT_LEN (1024), OUTPUT_LEN (128), NUM_PROMPTS (64),
# PER_CONC (4 prompts per unit of concurrency), MAX_PROMPTS (cap per level; none), LEVELS (1,2,...,256), DATASET_PATH (a ShareGPT-layout
# file of prompts instead of random token ids; OUTPUT_LEN tokens each). After the sweep the server's
# /get_server_info is saved as $NAME.server_info.json.
set -u -o pipefail

OUT_DIR=${1:?usage: serving_sweep_gpu.sh OUT_DIR [MODEL_DIR]}
MODEL=${2:-/tmp/gpu_check/llama-3.1-8b}
NAME=${NAME:-bench_serving_8b}
PORT=${PORT:-30000}
LABEL=${LABEL:-ours, llama-3.1-8b shapes}
HEALTH_DEADLINE_S=${HEALTH_DEADLINE_S:-300}
SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-0}
D=$OUT_DIR/$NAME
mkdir -p "$OUT_DIR"

if [ ! -f "$MODEL/config.json" ]; then  # never write into a directory that already holds a model
  echo "== making $MODEL (random Llama-3.1-8B weights)"
  python -m sglang.tools.make_random_model "$MODEL" --config llama-3.1-8b --device cuda || exit 1
fi

source "$(dirname "$0")/serve_lib.sh"

echo "== $(date +%T) starting the server on $MODEL"
python -m sglang.launch_server --model-path "$MODEL" --port "$PORT" --max-running-requests 256 \
  ${SERVER_ARGS:-} > "$D.server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT

start=$SECONDS
wait_healthy $SERVER "$PORT" "$D.server.log" "$HEALTH_DEADLINE_S" || exit 1
echo "== $(date +%T) server healthy after $((SECONDS - start)) s"

bench_args
sweep=(python -m sglang.bench_serving --backend sglang --port "$PORT" "${BENCH_ARGS[@]}" --label "$LABEL"
  --output-file "$D.jsonl")
if (( SWEEP_TIMEOUT_S > 0 )); then sweep=(timeout "$SWEEP_TIMEOUT_S" "${sweep[@]}"); fi
t0=$SECONDS
"${sweep[@]}"
rc=$?
save_server_info "$PORT" "$D.server_info.json"
echo "== $(date +%T) sweep exit $rc after $((SECONDS - t0)) s; $( [ -f "$D.jsonl" ] && wc -l < "$D.jsonl" || echo 0) levels written"

python -m sglang.bench_serving plot "$D.jsonl" --output "$D.png" --title "${TITLE:-bench_serving, Llama-3.1-8B shapes, 1 x H200}" \
  || echo "plot failed"
exit $rc
