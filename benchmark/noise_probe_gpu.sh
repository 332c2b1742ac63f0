#!/usr/bin/env bash
# Where the demo pair's run-to-run spread comes from (issue 8: two rounds of one server at one
# level, seconds apart, differed by up to 52% in session 9, which no 2% envelope survives).
# Three no-draft demo servers up at once: "default" as the envelope runs them; "omp1", the same
# with OMP_NUM_THREADS=1 (idle OpenMP threads spin on cores the others need); "pinned", also held
# to four physical cores of its own (one thread of each). The client is pinned to two other
# cores. interleaved_sweep.py measures them in turn, ROUNDS times per level, while start_monitor
# samples the GPU's and the CPUs' clocks.
#
#   bash benchmark/noise_probe_gpu.sh OUT
#
# Writes OUT/noise_{default,omp1,pinned}.rounds.jsonl and OUT/noise_monitor.txt (every round's
# throughput beside the clocks over its span; the coefficient of variation per server and level;
# how the spread follows each clock). Env: LEVELS (1,8,64), ROUNDS (6), NUM_PROMPTS (64),
# PER_CONC (16), OUTPUT_LEN (128), PORT (30000), EXTRA_SERVER_ARGS (`--device cpu` for a dry
# run), KV_TOKENS (1M).
set -u -o pipefail
OUT=${1:?usage: noise_probe_gpu.sh OUT}
WORK=/tmp/noise_probe
mkdir -p "$OUT" "$WORK"
source benchmark/serve_lib.sh
MODEL=$(python -c "from sglang import demo; print(demo.TARGET_PATH)")
PORT=${PORT:-30000}
# Four physical cores for the pinned server, two for the client (cpu_sets in serve_lib.sh).
{ read -r SERVER_CPUS; read -r CLIENT_CPUS; } < <(cpu_sets 1)
echo "== pinned server on CPUs $SERVER_CPUS, client on $CLIENT_CPUS"
PIDS=() URLS=()
trap 'kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null' EXIT
NAMES=(default omp1 pinned)
for i in 0 1 2; do
  case ${NAMES[$i]} in
    default) prefix=() ;;
    omp1) prefix=(env OMP_NUM_THREADS=1) ;;
    pinned) prefix=(env OMP_NUM_THREADS=1 taskset -c "$SERVER_CPUS") ;;
  esac
  "${prefix[@]}" python -m sglang.launch_server --model-path "$MODEL" --port $(( PORT + i )) --max-running-requests 256 \
    --max-total-tokens "${KV_TOKENS:-1048576}" ${EXTRA_SERVER_ARGS:-} > "$OUT/noise_${NAMES[$i]}.server.log" 2>&1 &
  PIDS+=($!) URLS+=("--server=noise_${NAMES[$i]}=http://127.0.0.1:$(( PORT + i ))")
done
DATA=$WORK/code_256.jsonl
[ -f "$DATA" ] || python benchmark/make_code_dataset.py "$MODEL" "$DATA" --num 1024 --input-len 256 2>&1 | tail -1
for i in 0 1 2; do
  wait_healthy "${PIDS[$i]}" $(( PORT + i )) "$OUT/noise_${NAMES[$i]}.server.log" 300 || exit 1
done
start_monitor "$OUT/noise_monitor"
taskset -c "$CLIENT_CPUS" timeout 500 python benchmark/interleaved_sweep.py "${URLS[@]}" \
  --rounds "${ROUNDS:-6}" --out-dir "$OUT" --dataset-name sharegpt --dataset-path "$DATA" \
  --sharegpt-output-len "${OUTPUT_LEN:-128}" --num-prompts "${NUM_PROMPTS:-64}" \
  --prompts-per-concurrency "${PER_CONC:-16}" --max-prompts-per-level 1024 --max-concurrency "${LEVELS:-1,8,64}" \
  --warmup-requests 8 --flush-cache --disable-tqdm | grep "^concurrency"
rc=$?
stop_monitor
python benchmark/monitor_report.py --monitor "$OUT/noise_monitor" "$OUT"/noise_*.rounds.jsonl | tee "$OUT/noise_monitor.txt" | tail -14
rm -f "$OUT"/noise_{default,omp1,pinned}.jsonl
(cd "$OUT" && tar czf noise_servers.tgz noise_*.server.log noise_monitor.*.csv && rm -f noise_*.server.log noise_monitor.*.csv)
exit $rc
