#!/usr/bin/env bash
# The envelope of dynamic speculation (issue 8) on the GPU machine: servers on one model (no draft;
# always EAGLE-3 at k = 3; dynamic with the default policy; optionally the policy forced to plain
# with either draft strategy), each swept over concurrency 1..256 with bench_serving, then the
# envelope report and one plot.
#
#   bash benchmark/spec_envelope_gpu.sh OUT CONFIG [SERVER...]
#
# CONFIG: 8b-accA, e.g. 8b-acc2 / 8b-acc1.5 (Llama-3.1-8B shapes, random weights, a random 8B-shaped
# EAGLE-3 draft, SGLANG_SIMULATE_ACC_LEN=A for the speculative servers) or demo (the shipped
# pair with its real acceptance: prompts are windows of Python standard-library files, its domain,
# made by make_code_dataset.py; DATASET=random gives random token ids, where its draft accepts
# ~0.05 per position). SERVER: no_draft, always, dynamic (the default three), never_warm,
# never_catch_up (policy `never`, the draft kept warm / caught up), no_draft_per_step /
# always_per_step (SGLANG_STREAM_EVERY_STEP=1: the front end without coalescing, for A/B runs
# against no_draft / always), k1 (k = 1 on every step: the cost policy with one candidate, so the
# same simulated rate per position as the k = 3 servers), k3 (k = 3 on every step through the cost
# policy with one candidate: what always does, with the adaptive server's host work and none of its
# exploration or switches), always_nofreeze (always with SGLANG_GC_NO_FREEZE=1: start-up objects left in
# the garbage collector's passes, for an A/B of the freeze), no_draft_b (a second no-draft server: the
# A/A control for python -m sglang.benchmark.envelope). TRACE=FILE (with ROUNDS > 0): every server
# plays that bench_serving --trace in turn, ROUNDS times, instead of the levels. The no-draft sweep does not
# depend on the accept length: it is named after the model (8b_no_draft, demo_no_draft), so one
# no-draft sweep serves both 8B configs. The report runs when OUT holds all three sweeps.
# Env: LEVELS, INPUT_LEN, OUTPUT_LEN, NUM_PROMPTS, PER_CONC, MAX_PROMPTS, SWEEP_TIMEOUT_S (as
# serving_sweep_gpu.sh; defaults here: input 1024, output 128, 32 prompts or 3 per unit of
# concurrency; for the demo see below), ROUNDS (> 0: all servers up at once, each level measured
# ROUNDS times per server in turn by interleaved_sweep.py, after WARMUP_ROUNDS unpooled ones
# (default 0; interleaved_sweep.py --warmup-rounds), within 95% of SWEEP_TIMEOUT_S per server (a round
# that would not fit is not started; --time-budget-s); the demo's default is 2, the 8B
# configs' 0, one sweep per server: three 8B servers do not fit one GPU's memory with KV for
# concurrency 256), DATASET (demo: code or random), EXTRA_SERVER_ARGS (added to every server,
# e.g. `--device cpu` for a dry run), MODEL / DRAFT (override the config's pair, e.g. tiny models
# for a dry run), PORT (the first server's; the others take the next ones), KV_TOKENS (see below),
# PIN (1, with ROUNDS > 0: each server on CPUs of its own with OMP_NUM_THREADS=1, the client on
# two more; cpu_sets in serve_lib.sh; or roles, with ROUNDS > 0: every server's HTTP process,
# scheduler and detokenizer on the same two CPUs per role, since one server is measured at a
# time, OMP_NUM_THREADS=1, the client on two more: no server's result depends on where the kernel
# put it), STEP_TIMES (1: every server's scheduler times its steps by phase, SGLANG_STEP_TIMES,
# one table per busy period, NAME.steps.N.txt in the archive), LOAD_FORMAT (passed to every server as
# --load-format; dummy makes the 8B target as config.json and tokenizer only, and every server draws
# random weights itself: seconds at start-up instead of minutes writing and reading 16 GB). Servers always_b and always_c are
# further always servers, controls: always_b's ratio to always at each level is the spread between
# identical servers, which the report prints beside the envelope. With dynamic_b (a second
# dynamic server) as well, always_b and dynamic_b are second instances instead: the report judges
# each kind by its two instances pooled, which averages out an offset one server process keeps
# through the run, and prints the spread between instances. dynamic_x: dynamic with every other
# candidate run for a burst EXPLORE_EVERY (default 24) steps after it last ran at a bucket
# (SGLANG_SPEC_EXPLORE_EVERY, benchmark-only: each k's cost beside the others' all the time), with the
# draft following every request (SGLANG_DRAFT_FOLLOWS_ALL: a request the draft does not follow can only
# decode plainly, and where the policy admits every request without the draft nothing is explored). COST_LOG=1:
# every speculative server writes its cost log (SGLANG_SPEC_COST_LOG); the logs and what
# python -m sglang.benchmark.cost_log_report reads from them (cost_report.txt / .json) go into CONFIG_cost_logs.tgz. no_draft_unbatched / always_unbatched:
# no draft / always with --admission-batch-steps 0 (every arrival admitted at once, passes not kept
# within a prefill graph: the behaviour before), the same-run
# reference for admission batching (not part of the envelope report).
set -u -o pipefail
OUT=${1:?usage: spec_envelope_gpu.sh OUT CONFIG [SERVER...]}
CONFIG=${2:?usage: spec_envelope_gpu.sh OUT CONFIG [SERVER...]}
shift 2
SERVERS=${*:-no_draft always dynamic}
WORK=/tmp/spec_envelope
mkdir -p "$OUT" "$WORK"
export SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-170}
case "$CONFIG" in
  8b-acc*)
    export NUM_PROMPTS=${NUM_PROMPTS:-32} PER_CONC=${PER_CONC:-3}
    if [ -z "${MODEL:-}" ]; then
      WEIGHTS=True; [ "${LOAD_FORMAT:-}" = dummy ] && WEIGHTS=False
      python - <<PY || exit 1
from sglang.benchmark.speculative_levels import make_pair
make_pair("8b", "/tmp/spec_envelope", weights=$WEIGHTS)
PY
    fi
    TARGET_DIR=llama-3.1-8b; [ "${LOAD_FORMAT:-}" = dummy ] && TARGET_DIR=llama-3.1-8b-config
    MODEL=${MODEL:-$WORK/$TARGET_DIR}; DRAFT=${DRAFT:-$WORK/llama-3.1-8b-eagle3}
    ACC=${CONFIG#8b-acc}; case "$ACC" in *.*) ;; *) ACC=$ACC.0 ;; esac
    SIM="SGLANG_SIMULATE_ACC_LEN=$ACC"; PAIR=8b ;;
  demo)
    MODEL=${MODEL:-$(python -c "from sglang import demo; print(demo.TARGET_PATH)")}
    DRAFT=${DRAFT:-$(python -c "from sglang import demo; print(demo.DRAFT_PATH)")}
    SIM=""; PAIR=demo
    # The pair was trained on 512-token windows: input + output stay inside that, or its draft
    # stops predicting (at 1024 in it accepted 0.24 at the first position). A step takes under a
    # millisecond, so the host sets the speed and sweeps run one after another are noisy (session
    # 9: two servers making the same choices differed by up to 37% at a level). So by default the
    # demo's servers run at once and are measured in turn at every level (ROUNDS=2: A B C, C B A),
    # each round at least 96 prompts and 32 per unit of concurrency up to 1024 (levels of ~2-5 s
    # per round). ROUNDS=0 gives the sequential sweeps: at least 160 and 64 per unit up to 2048.
    export ROUNDS=${ROUNDS:-2}
    if (( ROUNDS > 0 )); then
      export NUM_PROMPTS=${NUM_PROMPTS:-96} PER_CONC=${PER_CONC:-32} MAX_PROMPTS=${MAX_PROMPTS:-1024}
    else
      export NUM_PROMPTS=${NUM_PROMPTS:-160} PER_CONC=${PER_CONC:-64} MAX_PROMPTS=${MAX_PROMPTS:-2048}
    fi
    export INPUT_LEN=${INPUT_LEN:-256}
    if [ "${DATASET:-code}" = code ]; then  # the pair's own domain: its real acceptance
      MAX_LEVEL=$(echo "${LEVELS:-256}" | tr , '\n' | sort -n | tail -1)
      NEED=$(( NUM_PROMPTS > PER_CONC * MAX_LEVEL ? NUM_PROMPTS : PER_CONC * MAX_LEVEL ))
      NEED=$(( NEED < MAX_PROMPTS ? NEED : MAX_PROMPTS ))
      NEED=$(( NEED > 8 ? NEED : 8 ))  # the sweep's 8 warm-up requests come from the file too
      export DATASET_PATH=$WORK/demo_code_${INPUT_LEN:-1024}_$NEED.jsonl
      [ -f "$DATASET_PATH" ] || python benchmark/make_code_dataset.py "$MODEL" "$DATASET_PATH" --num "$NEED" \
        --input-len "${INPUT_LEN:-1024}" || exit 1
    fi ;;
  *) echo "unknown config $CONFIG (8b-accA for a simulated accept length A, e.g. 8b-acc2 or 8b-acc1.5; demo)"; exit 2 ;;
esac
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3"
EXTRA=${EXTRA_SERVER_ARGS:-}
[ -n "${LOAD_FORMAT:-}" ] && EXTRA="$EXTRA --load-format $LOAD_FORMAT"
server() {  # SERVER -> NAME (its files' name), LABEL, ENV (extra environment), ARGS (launch_server flags)
  case "$1" in
    no_draft) NAME=${PAIR}_no_draft LABEL=no_draft ENV="" ARGS="" ;;
    always) NAME=${CONFIG}_always LABEL=always ENV=$SIM ARGS=$SPEC ;;
    dynamic) NAME=${CONFIG}_dynamic LABEL=dynamic ENV=$SIM ARGS="$SPEC --speculative-adaptive" ;;
    never_warm) NAME=${CONFIG}_never_warm LABEL="plain, draft warm" ENV=$SIM
      ARGS="$SPEC --speculative-policy never --speculative-draft-sync warm" ;;
    never_catch_up) NAME=${CONFIG}_never_catch_up LABEL="plain, draft catch-up" ENV=$SIM
      ARGS="$SPEC --speculative-policy never --speculative-draft-sync catch-up" ;;
    no_draft_per_step) NAME=${PAIR}_no_draft_per_step LABEL="no draft, every step streamed"
      ENV=SGLANG_STREAM_EVERY_STEP=1 ARGS="" ;;
    always_per_step) NAME=${CONFIG}_always_per_step LABEL="always, every step streamed"
      ENV="$SIM SGLANG_STREAM_EVERY_STEP=1" ARGS=$SPEC ;;
    k1) NAME=${CONFIG}_k1 LABEL="k = 1" ENV=$SIM ARGS="$SPEC --speculative-adaptive --speculative-candidate-steps 1" ;;
    k3) NAME=${CONFIG}_k3 LABEL="k = 3, adaptive" ENV=$SIM ARGS="$SPEC --speculative-adaptive --speculative-candidate-steps 3" ;;
    always_nofreeze) NAME=${CONFIG}_$1 LABEL="always, start-up objects not frozen" ENV="$SIM SGLANG_GC_NO_FREEZE=1"
      ARGS=$SPEC ;;
    no_draft_b) NAME=${PAIR}_no_draft_b LABEL="no draft (A/A)" ENV="" ARGS="" ;;
    always_b|always_c) NAME=${CONFIG}_$1 LABEL="always (control ${1#always_})" ENV=$SIM ARGS=$SPEC ;;
    dynamic_b) NAME=${CONFIG}_$1 LABEL="dynamic (instance b)" ENV=$SIM ARGS="$SPEC --speculative-adaptive" ;;
    dynamic_x) NAME=${CONFIG}_$1 LABEL="dynamic, dense exploration" ENV="$SIM SGLANG_SPEC_EXPLORE_EVERY=${EXPLORE_EVERY:-24} SGLANG_DRAFT_FOLLOWS_ALL=1"
      ARGS="$SPEC --speculative-adaptive" ;;
    no_draft_unbatched) NAME=${PAIR}_no_draft_unbatched LABEL="no draft, admissions not batched" ENV=""
      ARGS="--admission-batch-steps 0" ;;
    always_unbatched|always_unbatched_b) NAME=${CONFIG}_$1 LABEL="always, admissions not batched" ENV=$SIM
      ARGS="$SPEC --admission-batch-steps 0" ;;
    *) echo "unknown server $1"; exit 2 ;;
  esac
  [ "${STEP_TIMES:-0}" = 1 ] && ENV="$ENV SGLANG_STEP_TIMES=$OUT/$NAME.steps"
  [ "${COST_LOG:-0}" = 1 ] && ENV="$ENV SGLANG_SPEC_COST_LOG=$OUT/$NAME.costlog"
}
FAILED=""
if (( ${ROUNDS:-0} > 0 )); then
  # All servers up at once, each on its own port, measured in turn at every level by
  # interleaved_sweep.py: a drift of the machine's speed falls on all alike. Each server's KV
  # cache is capped at KV_TOKENS (default 1M tokens, ~10 GiB on the demo pair; concurrency 256 at
  # input 256 + output 128 needs ~100K): servers starting together size their cache from the free
  # memory they see, and a fraction of it would leave the last one none.
  source benchmark/serve_lib.sh
  set -- $SERVERS
  PIDS=() URLS=() NAMES=()
  trap 'kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null' EXIT
  CPUS=() CLIENT=() ROLE_CPUS=()
  if [ "${PIN:-0}" = 1 ]; then
    mapfile -t CPUS < <(cpu_sets $#)
    CLIENT=(taskset -c "${CPUS[$#]}")
    echo "== pinned: servers on CPUs ${CPUS[*]:0:$#}, the client on ${CPUS[$#]}"
  elif [ "${PIN:-0}" = roles ]; then
    mapfile -t ROLE_CPUS < <(role_cpu_sets)
    CLIENT=(taskset -c "${ROLE_CPUS[3]}")
    echo "== pinned by role, alike for every server: HTTP on CPUs ${ROLE_CPUS[0]}, scheduler on ${ROLE_CPUS[1]}," \
      "detokenizer on ${ROLE_CPUS[2]}, the client on ${ROLE_CPUS[3]}"
  fi
  for s in "$@"; do
    server "$s"; port=$(( ${PORT:-30000} + ${#PIDS[@]} ))
    PREFIX=()
    [ "${PIN:-0}" = 1 ] && PREFIX=(taskset -c "${CPUS[${#PIDS[@]}]}" env OMP_NUM_THREADS=1)
    [ "${PIN:-0}" = roles ] && PREFIX=(env OMP_NUM_THREADS=1)
    "${PREFIX[@]}" env $ENV python -m sglang.launch_server --model-path "$MODEL" --port $port --max-running-requests 256 \
      --max-total-tokens "${KV_TOKENS:-1048576}" $ARGS $EXTRA > "$OUT/$NAME.server.log" 2>&1 &
    PIDS+=($!) URLS+=("$NAME=http://127.0.0.1:$port") NAMES+=("$NAME")
  done
  echo "== $(date +%T) $CONFIG: starting $SERVERS"
  for i in "${!PIDS[@]}"; do
    wait_healthy "${PIDS[$i]}" $(( ${PORT:-30000} + i )) "$OUT/${NAMES[$i]}.server.log" "${HEALTH_DEADLINE_S:-300}" \
      || FAILED="$FAILED ${NAMES[$i]}"
  done
  if [ -z "$FAILED" ] && [ "${PIN:-0}" = roles ]; then
    for i in "${!PIDS[@]}"; do
      pin_roles "${PIDS[$i]}" "${ROLE_CPUS[@]:0:3}" || FAILED="$FAILED ${NAMES[$i]}(pinning)"
    done
  fi
  if [ -z "$FAILED" ]; then
    echo "== $(date +%T) all healthy; $ROUNDS rounds per level"
    # GPU memory per process with every server up (the schedulers hold it; ps maps them to ports)
    { nvidia-smi --query-compute-apps=pid,used_memory --format=csv; ps -eo pid,ppid,args | grep -E 'sglang|launch_server' \
      | grep -v grep; } > "$OUT/${CONFIG}_monitor.memory.txt" 2>&1
    start_monitor "$OUT/${CONFIG}_monitor"
    bench_args
    [ -n "${TRACE:-}" ] && BENCH_ARGS+=(--trace "$TRACE")
    "${CLIENT[@]}" timeout $(( SWEEP_TIMEOUT_S * $# )) python benchmark/interleaved_sweep.py "${URLS[@]/#/--server=}" --rounds "$ROUNDS" \
      --warmup-rounds "${WARMUP_ROUNDS:-0}" --time-budget-s $(( SWEEP_TIMEOUT_S * $# * 95 / 100 )) \
      --out-dir "$OUT" "${BENCH_ARGS[@]}" | grep -E "^(concurrency|trace)" || {
      FAILED="$FAILED interleaved sweep"
      # Cut short (SWEEP_TIMEOUT_S, a server lost): pool the rounds every server finished, so they are reported.
      python benchmark/interleaved_sweep.py repool "$OUT" "${NAMES[@]}" | sed 's/^/== repooled after the failed sweep: /'; }
    stop_monitor
    python benchmark/monitor_report.py --monitor "$OUT/${CONFIG}_monitor" "$OUT"/*.rounds.jsonl \
      > "$OUT/${CONFIG}_monitor.txt" 2>&1
    for i in "${!PIDS[@]}"; do
      save_server_info $(( ${PORT:-30000} + i )) "$OUT/${NAMES[$i]}.server_info.json"
    done
    if compgen -G "$OUT/*.costlog.*.txt" > /dev/null; then
      (cd "$OUT" && python -m sglang.benchmark.cost_log_report *.costlog.*.txt --json cost_report.json \
        > cost_report.txt 2>&1; tar czf "${CONFIG}_cost_logs.tgz" *.costlog.*.txt cost_report.*; \
        rm -f *.costlog.*.txt cost_report.*)
    fi
  fi
else
  for s in $SERVERS; do
    echo "== $(date +%T) $CONFIG: $s"
    server "$s"
    # The machine's CPU time by kind (user .. steal, /proc/stat) around the sweep: a virtual CPU
    # the host takes away shows as steal.
    { date +%T; grep '^cpu ' /proc/stat; } > "$OUT/$NAME.procstat" 2>/dev/null
    env NAME="$NAME" LABEL="$LABEL" TITLE="envelope $CONFIG" SERVER_ARGS="$ARGS $EXTRA" $ENV \
      bash benchmark/serving_sweep_gpu.sh "$OUT" "$MODEL" 2>&1 | tail -4 || FAILED="$FAILED $s"
    { date +%T; grep '^cpu ' /proc/stat; } >> "$OUT/$NAME.procstat" 2>/dev/null
  done
fi
N=$OUT/${PAIR}_no_draft.jsonl A=$OUT/${CONFIG}_always.jsonl D=$OUT/${CONFIG}_dynamic.jsonl
B=$OUT/${CONFIG}_always_b.jsonl D2=$OUT/${CONFIG}_dynamic_b.jsonl
if [ -z "${TRACE:-}" ] && [ -f "$N" ] && [ -f "$A" ] && [ -f "$D" ]; then
  # With dynamic_b as well, always_b and dynamic_b are second instances, each kind judged pooled;
  # without it, always_b is the A/A control (reported, not judged).
  if [ -f "$D2" ] && [ -f "$B" ]; then KINDS=(--always "$A" --always "$B" --dynamic "$D" --dynamic "$D2")
  else KINDS=(--always "$A" --dynamic "$D" $( [ -f "$B" ] && echo --control "$B" )); fi
  python -m sglang.benchmark.envelope_report --no-draft "$N" "${KINDS[@]}" \
    $( [ -f "$OUT/${CONFIG}_dynamic.server_info.json" ] && echo --server-info "$OUT/${CONFIG}_dynamic.server_info.json" ) --out "$OUT/${CONFIG}_envelope.json"
  python -m sglang.bench_serving plot "$N" "$A" "$D" --output "$OUT/${CONFIG}_envelope.png" \
    --title "envelope $CONFIG, 1 x H200"
fi
# At most 8 files come back from a device call: the sweeps' JSONL, the report and the plot stay
# loose; the single-sweep plots go; the server logs, /get_server_info snapshots and the rounds' lines of an
# interleaved run go into one archive.
find "$OUT" -maxdepth 1 -name '*.png' ! -name '*_envelope.png' -delete
# Servers stop before the archive is made: one that idles after its last play writes a step-times file
# then, which would land beside the archive and push the call past its file limit.
if [ -n "${PIDS+set}" ] && [ "${#PIDS[@]}" -gt 0 ]; then kill "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}" 2>/dev/null; fi
(cd "$OUT" && tar czf "${CONFIG}_servers.tgz" *.server.log *.server_info.json $(ls *.rounds.jsonl *.warmup.jsonl *_monitor.* *.steps.* *.procstat 2>/dev/null) \
  && rm -f *.server.log *.server_info.json *.rounds.jsonl *.warmup.jsonl *_monitor.* *.steps.* *.procstat)
if [ -n "$FAILED" ]; then
  echo "sweeps that failed:$FAILED (their server logs are in ${CONFIG}_servers.tgz)"; exit 1
fi
