#!/usr/bin/env bash
# Where each demo server's scheduler spends its host time under serving load, sampled with py-spy
# (no tracing profiler: cProfile's per-call cost distorts a loop of small calls). Servers up at
# once (default: always EAGLE-3 at k = 3, dynamic, no draft); each gets bench_serving at every
# level in turn while py-spy records its scheduler process (and, with SPY_HTTP=1, its HTTP
# process) for SPY_S seconds in the middle of the level.
#
#   bash benchmark/sched_spy_gpu.sh OUT [SERVER...]
#
# Needs py-spy on the PATH (the GPU machine: `benchmark/stage_device_extras.sh` stages its wheel;
# it lands in /tmp/site/bin). On the GPU machine py-spy does not sample these processes (session
# 12: --native took 1-22 samples in 4 s; without it every sample of a busy process was the same
# stale idle stack), so there this script gives throughputs only; on a CPU machine it profiles
# (a dry run: KV_TOKENS=65536 LEVELS=4 SPY_S=2).
# Writes OUT/spy.tgz (raw collapsed stacks per server and level, `spy_SERVER_cCONC_ROLE.txt`, for
# benchmark/spy_report.py; the server logs) and OUT/spy.jsonl (bench_serving's lines).
# Env: LEVELS (1,4,64), PROMPTS_PER_CONC (175), NUM_DATA (prompts made, 2560), SPY_S (4), NATIVE
# (1: C frames too, slow to unwind through torch's libraries), RATE (samples per second, 200),
# PORT (30000), OUTPUT_LEN (128), EXTRA_SERVER_ARGS (`--device cpu` for a dry run), KV_TOKENS
# (each server's KV cache, 1M tokens), SPY_HTTP (1: the HTTP process as well).
set -u -o pipefail
OUT=${1:?usage: sched_spy_gpu.sh OUT [SERVER...]}
shift
SERVERS=(${*:-always dynamic no_draft})
WORK=/tmp/sched_spy
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
source benchmark/serve_lib.sh
export PATH="/tmp/site/bin:$PATH"
command -v py-spy > /dev/null || { echo "py-spy is not installed (benchmark/stage_device_extras.sh)"; exit 1; }
demo_pair
PORT=${PORT:-30000}
PIDS=()
trap 'kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null' EXIT
for i in "${!SERVERS[@]}"; do
  case "${SERVERS[$i]}" in
    always) args=$SPEC ;;
    dynamic) args="$SPEC --speculative-adaptive" ;;
    no_draft) args="" ;;
    *) echo "unknown server ${SERVERS[$i]} (always, dynamic, no_draft)"; exit 2 ;;
  esac
  python -m sglang.launch_server --model-path "$MODEL" --port $(( PORT + i )) --max-running-requests 256 \
    --max-total-tokens "${KV_TOKENS:-1048576}" $args ${EXTRA_SERVER_ARGS:-} > "$WORK/${SERVERS[$i]}.server.log" 2>&1 &
  PIDS+=($!)
done
DATA=$WORK/code_256.jsonl NUM_DATA=${NUM_DATA:-2560}
python benchmark/make_code_dataset.py "$MODEL" "$DATA" --num "$NUM_DATA" --input-len 256 2>&1 | tail -1
for i in "${!SERVERS[@]}"; do
  wait_healthy "${PIDS[$i]}" $(( PORT + i )) "$WORK/${SERVERS[$i]}.server.log" 300 || exit 1
done
NATIVE_FLAG=(); [ "${NATIVE:-0}" = 1 ] && NATIVE_FLAG=(--native)
for level in $(echo "${LEVELS:-1,4,64}" | tr , ' '); do
  for i in "${!SERVERS[@]}"; do
    name=${SERVERS[$i]}
    sched=$(pgrep -P "${PIDS[$i]}" sglang-sched | head -1)
    # Enough prompts to keep the level busy well past the sampling window (the demo pair streams
    # ~3K tok/s per request at concurrency 4, ~40K tok/s in all at 64: ~7-8 s at 128 tokens each).
    prompts=$(( level * ${PROMPTS_PER_CONC:-175} ))
    prompts=$(( prompts < NUM_DATA ? prompts : NUM_DATA ))
    timeout 120 python -m sglang.bench_serving --backend sglang --port $(( PORT + i )) --dataset-name sharegpt \
      --dataset-path "$DATA" --sharegpt-output-len "${OUTPUT_LEN:-128}" --num-prompts "$prompts" \
      --max-concurrency "$level" --warmup-requests 4 --flush-cache --disable-tqdm --label "$name" \
      --output-file "$OUT/spy.jsonl" > "$WORK/bench_${name}_c$level.log" 2>&1 &
    bench=$!
    sleep 2  # past the warm-up requests and the ramp
    targets=("sched:$sched")
    [ "${SPY_HTTP:-0}" = 1 ] && targets+=("http:${PIDS[$i]}")
    spies=()
    for target in "${targets[@]}"; do
      role=${target%%:*} pid=${target#*:}
      py-spy record -p "$pid" -r "${RATE:-200}" -d "${SPY_S:-4}" -f raw --idle "${NATIVE_FLAG[@]}" \
        -o "$WORK/spy_${name}_c${level}_$role.txt" > "$WORK/spy_${name}_c${level}_$role.log" 2>&1 &
      spies+=($!)
    done
    wait "${spies[@]}"
    wait $bench
    echo "$name concurrency $level: $(grep -h 'Output token throughput' "$WORK/bench_${name}_c$level.log")"
    tail -n 1 "$WORK"/spy_${name}_c${level}_*.log
  done
done
(cd "$WORK" && tar czf "$OUT/spy.tgz" spy_*.txt spy_*.log bench_*.log *.server.log)
