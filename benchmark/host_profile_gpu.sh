#!/usr/bin/env bash
# Where the scheduler's host time goes on the demo pair under serving load (issue 8: the pair is
# host-bound, and speculation loses to plain decoding at concurrency 8-32 although its steps take
# less device time per token). Two servers up at once (always EAGLE-3 at k = 3, and no draft), each
# with SGLANG_SCHEDULER_PROFILE; each gets bench_serving at concurrency 1 and then 16 with a pause
# between, so every level is one busy period of its scheduler's profile.
#
#   bash benchmark/host_profile_gpu.sh OUT
#
# Writes OUT/host_profile.tgz (per server: PREFIX.N.{prof,txt}, N = 0 the start-up warm-up, 1
# concurrency 1, 2 concurrency 16; the server logs) and OUT/host_profile.jsonl (bench_serving's
# lines; throughput under cProfile, not a speed result). Env: LEVELS (1,16), PORT (30000),
# PROMPTS (per level; default 32 x concurrency, at least 64), OUTPUT_LEN (128), EXTRA_SERVER_ARGS
# (`--device cpu` for a dry run), KV_TOKENS (each server's KV cache, 1M tokens).
set -u -o pipefail
OUT=${1:?usage: host_profile_gpu.sh OUT}
WORK=/tmp/host_profile
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
source benchmark/serve_lib.sh
demo_pair
PORT=${PORT:-30000}
PIDS=()
trap 'kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null' EXIT
NAMES=(always no_draft)
for i in 0 1; do
  args=""; [ "${NAMES[$i]}" = always ] && args=$SPEC
  SGLANG_SCHEDULER_PROFILE=$WORK/${NAMES[$i]} python -m sglang.launch_server --model-path "$MODEL" \
    --port $(( PORT + i )) --max-running-requests 256 --max-total-tokens "${KV_TOKENS:-1048576}" $args ${EXTRA_SERVER_ARGS:-} \
    > "$WORK/${NAMES[$i]}.server.log" 2>&1 &
  PIDS+=($!)
done
DATA=$WORK/code_256.jsonl
python benchmark/make_code_dataset.py "$MODEL" "$DATA" --num 600 --input-len 256 2>&1 | tail -1
for i in 0 1; do
  wait_healthy "${PIDS[$i]}" $(( PORT + i )) "$WORK/${NAMES[$i]}.server.log" 300 || exit 1
done
sleep 2.5  # the start-up warm-up's busy period is written
for i in 0 1; do
  for level in $(echo "${LEVELS:-1,16}" | tr , ' '); do
    timeout 120 python -m sglang.bench_serving --backend sglang --port $(( PORT + i )) --dataset-name sharegpt \
      --dataset-path "$DATA" --sharegpt-output-len "${OUTPUT_LEN:-128}" \
      --num-prompts "${PROMPTS:-$(( level * 32 > 64 ? level * 32 : 64 ))}" \
      --max-concurrency "$level" --warmup-requests 4 --flush-cache --disable-tqdm --label "${NAMES[$i]}" \
      --output-file "$OUT/host_profile.jsonl" 2>&1 | grep "Output token throughput\|error"
    sleep 2.5  # a poll interval of idleness: the level's busy period is written
  done
done
ls "$WORK"
(cd "$WORK" && tar czf "$OUT/host_profile.tgz" *.prof *.txt *.server.log)
