#!/usr/bin/env bash
# Scale-out check on one GPU: 2 replicas behind sglang-router sharing the GPU
# (`python -m sglang.launch_server --dp-size 2`) against 1 server, at the same
# --mem-fraction-static (the replicas split it; each pays for its own copy of the weights), on the
# demo pair (EAGLE-3, --speculative-adaptive, prompts from the pair's own domain) and on
# Llama-3.1-8B shapes with random weights. A scaling check, not a speed claim: on one GPU the
# replicas compete for it. One server setup at a time; for each, bench_serving at LEVELS, each
# replica's /get_server_info, then one summary per model: OUT/dp_scaling_{demo,8b}.json.
#
#   bash benchmark/dp_scaling_gpu.sh OUT
#
# Env: CONFIGS ("demo 8b"), LEVELS (16,64), INPUT_LEN (demo 256, 8b 512), OUTPUT_LEN (128),
# NUM_PROMPTS (64), PER_CONC (2), SPEC_8B (1: the 8B servers also speculate, with a random 8B-shaped
# EAGLE-3 draft at SGLANG_SIMULATE_ACC_LEN=2.0 and --speculative-adaptive; default 0),
# MEM_FRACTION (0.85), PORT (30000), GRAPH_MAX_BS (the largest level), EXTRA_SERVER_ARGS (added to every server: `--device cpu` for a
# dry run on a CPU machine, with small LEVELS / NUM_PROMPTS and CONFIGS=demo). Needs sglang-router (stage it with
# ../shared/device/stage --with-router). About 4-5 minutes, the 8B checkpoint made on the way.
set -u -o pipefail
OUT=${1:?usage: dp_scaling_gpu.sh OUT}
mkdir -p "$OUT"
WORK=/tmp/dp_scaling
mkdir -p "$WORK"
cd "$(dirname "$0")/.."
source benchmark/serve_lib.sh
python -c "import sglang_router" 2>/dev/null || { echo "sglang-router is not installed: pip install 'sglang[router]'" \
  "(no internet here: ../shared/device/stage --with-router)"; exit 1; }
PORT=${PORT:-30000}
export LEVELS=${LEVELS:-16,64} OUTPUT_LEN=${OUTPUT_LEN:-128} NUM_PROMPTS=${NUM_PROMPTS:-64} PER_CONC=${PER_CONC:-2}
# No batch is larger than the largest level: graphs beyond it would only lengthen start-up.
GRAPH_MAX_BS=${GRAPH_MAX_BS:-$(echo "$LEVELS" | tr , '\n' | sort -n | tail -1)}
FAILED=""

run_setup() {  # CONFIG SETUP(single|dp2) MODEL ENV ARGS: one server setup, its sweep and its replicas' info
  local config=$1 setup=$2 model=$3 env=$4 args=$5 name=dp_${1}_${2} extra=()
  [ "$setup" = dp2 ] && extra=(--dp-size 2 --router-prometheus-port $((PORT + 100)) --router-log-level warn)
  echo "== $(date +%T) $config $setup: starting"
  env $env python -m sglang.launch_server --model-path "$model" --port "$PORT" --mem-fraction-static "${MEM_FRACTION:-0.85}" \
    --max-running-requests 256 --cuda-graph-max-bs "$GRAPH_MAX_BS" $args ${EXTRA_SERVER_ARGS:-} "${extra[@]}" \
    > "$OUT/$name.server.log" 2>&1 &
  local pid=$! start=$SECONDS
  if ! wait_healthy $pid "$PORT" "$OUT/$name.server.log" "${HEALTH_DEADLINE_S:-240}"; then
    FAILED="$FAILED $name"; kill $pid 2>/dev/null; wait $pid 2>/dev/null; return
  fi
  if [ "$setup" = dp2 ]; then  # the router answers /health before it has taken the replicas
    python - "$PORT" <<'PY' || { FAILED="$FAILED $name(workers)"; kill $pid; wait $pid; return; }
import json, sys, time, urllib.request
for _ in range(240):
    workers = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/workers", timeout=5).read())["workers"]
    if sum(w["is_healthy"] for w in workers) == 2:
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"the router lists {workers}")
PY
  fi
  echo "== $(date +%T) $config $setup: serving after $((SECONDS - start)) s"
  bench_args
  timeout "${SWEEP_TIMEOUT_S:-150}" python -m sglang.bench_serving --backend sglang --port "$PORT" "${BENCH_ARGS[@]}" \
    --label "$config $setup" --output-file "$OUT/$name.jsonl" > "$OUT/$name.bench.log" 2>&1 || FAILED="$FAILED $name(bench)"
  python - "$PORT" "$setup" "$OUT/$name.replicas.json" <<'PY'
import json, sys, urllib.request
port, setup, path = sys.argv[1:]
def get(url):
    return json.loads(urllib.request.urlopen(url, timeout=10).read())
base = f"http://127.0.0.1:{port}"
urls = [w["url"] for w in get(f"{base}/workers")["workers"]] if setup == "dp2" else [base]
json.dump({url: get(f"{url}/get_server_info") for url in urls}, open(path, "w"))
PY
  kill -TERM $pid
  for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  kill -0 $pid 2>/dev/null && { echo "$name did not stop within 30 s after SIGTERM"; FAILED="$FAILED $name(stop)"; kill -9 $pid; }
  wait $pid
  echo "== $(date +%T) $config $setup: stopped (exit $?)"
}

summarize() {  # CONFIG: OUT/dp_scaling_CONFIG.json from the two setups' sweeps and replica info
  python - "$OUT" "$1" <<'PY'
import json, os, sys
out, config = sys.argv[1:]
KEEP = ("output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
        "median_itl_ms", "completed", "duration", "accept_length")
STATE = ("num_generated_tokens", "spec_steps", "spec_plain_steps", "spec_steps_by_k", "avg_spec_accept_length")
summary = {"config": config, "setups": {}}
for setup in ("single", "dp2"):
    base = os.path.join(out, f"dp_{config}_{setup}")
    if not os.path.exists(base + ".jsonl"):
        continue
    levels = [json.loads(line) for line in open(base + ".jsonl")]
    info = json.load(open(base + ".replicas.json")) if os.path.exists(base + ".replicas.json") else {}
    summary["setups"][setup] = {
        "levels": {str(r["max_concurrency"]): {k: r.get(k) for k in KEEP} for r in levels},
        "replicas": {url: {"max_total_num_tokens": i.get("max_total_num_tokens"),
                           "replicas_per_gpu": i.get("replicas_per_gpu"),
                           **{k: i["internal_states"][0].get(k) for k in STATE}} for url, i in info.items()},
    }
s = summary["setups"]
if "single" in s and "dp2" in s:
    summary["dp2_over_single_output_throughput"] = {
        level: round(s["dp2"]["levels"][level]["output_throughput"] / r["output_throughput"], 3)
        for level, r in s["single"]["levels"].items() if level in s["dp2"]["levels"] and r["output_throughput"]}
json.dump(summary, open(os.path.join(out, f"dp_scaling_{config}.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "setups"}))
PY
}

for config in ${CONFIGS:-demo 8b}; do
  case "$config" in
    demo)
      demo_pair
      export INPUT_LEN=${INPUT_LEN_DEMO:-${INPUT_LEN:-256}}
      max_level=$(echo "$LEVELS" | tr , '\n' | sort -n | tail -1)
      need=$(( NUM_PROMPTS > PER_CONC * max_level ? NUM_PROMPTS : PER_CONC * max_level ))
      export DATASET_PATH=$WORK/demo_code_${INPUT_LEN}_$((need + 8)).jsonl
      [ -f "$DATASET_PATH" ] || python benchmark/make_code_dataset.py "$MODEL" "$DATASET_PATH" --num $((need + 8)) \
        --input-len "$INPUT_LEN" > /dev/null || { FAILED="$FAILED demo(dataset)"; continue; }
      ENV="" ARGS="$SPEC --speculative-adaptive" ;;
    8b)
      unset DATASET_PATH
      export INPUT_LEN=${INPUT_LEN_8B:-${INPUT_LEN:-512}}
      ENV="" ARGS="" MODEL=$WORK/llama-3.1-8b
      if [ "${SPEC_8B:-0}" != 1 ] && [ ! -f "$MODEL/config.json" ]; then
        python -m sglang.tools.make_random_model "$MODEL" --config llama-3.1-8b > /dev/null || { FAILED="$FAILED 8b(model)"; continue; }
      fi
      if [ "${SPEC_8B:-0}" = 1 ]; then  # the target and a random 8B-shaped EAGLE-3 draft, as the envelope runs use
        read -r MODEL DRAFT < <(python -c "import sys; sys.path.insert(0, 'benchmark')
from spec_speed import make_pair; print(*make_pair('8b', '$WORK'))") || { FAILED="$FAILED 8b(model)"; continue; }
        ENV="SGLANG_SIMULATE_ACC_LEN=2.0"
        ARGS="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3 --speculative-adaptive"
      fi ;;
    *) echo "unknown config $config (demo, 8b)"; exit 2 ;;
  esac
  run_setup "$config" single "$MODEL" "$ENV" "$ARGS"
  run_setup "$config" dp2 "$MODEL" "$ENV" "$ARGS"
  summarize "$config"
done
# The server logs and bench logs in one archive (few files come back from a device call).
(cd "$OUT" && tar czf dp_scaling_logs.tgz dp_*.server.log dp_*.bench.log dp_*.replicas.json 2>/dev/null \
  && rm -f dp_*.server.log dp_*.bench.log dp_*.replicas.json)
if [ -n "$FAILED" ]; then echo "FAILED:$FAILED"; exit 1; fi
echo "== $(date +%T) done: $OUT/dp_scaling_*.json"
