#!/usr/bin/env bash
# Dynamic speculation against the static servers on a time-varying trace (8B shapes) and on the demo pair
# (real acceptance, code prompts), one H200. Every part starts its servers at once and measures them in turn,
# 3 rounds in rotating order (benchmark/spec_envelope_gpu.sh with ROUNDS), and packs everything into
# OUT/PART.tgz with OUT/PART.txt (the envelope report).
#   t1: trace.json (concurrency 1 -> 256 -> 16 -> 128 -> 1, 10 s each, requests of accept length 3.0 and 1.4
#       in a shifting mix; 128-token prompts, 512 output tokens): no draft, always k = 3, dynamic, KV 128K each.
#   t2: the same trace: k = 1 on every step and dynamic (the reference shared with t1), KV 128K each.
#       (Four 8B servers with KV for concurrency 256 do not fit one H200, hence two runs.)
#   demo: the demo pair at concurrency 1, 4, 16, 64, 256 (256-token code prompts, 128 output tokens, 12 prompts
#       per unit of concurrency, at least 12, at most 512): no draft, always, dynamic and always_b (always's A/A
#       twin), pinned by role.
# Usage (GPU machine, repository root): PARTS="t1" bash benchmark/results/2026-12-05_trace_demo/run.sh OUT
# (ROUNDS=N for t1 / t2: three rounds of t1 took ~12 minutes with the random 8B pair written and read on a fresh
# machine; LOAD_FORMAT=dummy draws the weights in each server instead, and SWEEP_TIMEOUT_S caps each server's
# share of the plays so that the archive is still written inside a 600 s call. WARMUP_ROUNDS=N plays N
# unpooled rounds first at every level, spec_envelope_gpu.sh's.)
set -u -o pipefail
OUT=${1:?usage: run.sh OUT}
HERE=$(dirname "$0")
for part in ${PARTS:-t1 t2 demo}; do
  P=$OUT/$part
  mkdir -p "$P"
  case $part in
    t1|t2)
      # Three 8B servers with 128K tokens of KV each need ~115 GB: an 80 GB card fails at start-up.
      total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      if [ "${total:-0}" -lt 100000 ]; then
        echo "$part needs a GPU of more than 100 GB (this one has ${total:-?} MiB): skipped" | tee "$OUT/$part.txt"
        continue
      fi
      [ "$part" = t1 ] && servers="no_draft always dynamic" || servers="k1 dynamic"
      env INPUT_LEN=128 OUTPUT_LEN=512 NUM_PROMPTS=2 PER_CONC=1 HEALTH_DEADLINE_S=300 ROUNDS=${ROUNDS:-3} TRACE=${TRACE:-$HERE/trace.json} \
        KV_TOKENS=128000 PORT=30200 SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-175} bash benchmark/spec_envelope_gpu.sh "$P" 8b-acc3 $servers
      statics=()
      for s in no_draft always k1; do
        f=$P/8b-acc3_$s.jsonl; [ $s = no_draft ] && f=$P/8b_no_draft.jsonl
        [ -f "$f" ] && statics+=(--static "$s=$f")
      done
      python -m sglang.benchmark.envelope --dynamic "$P/8b-acc3_dynamic.jsonl" "${statics[@]}" --out "$P/report.json" \
        > "$OUT/$part.txt" 2>&1 ;;
    demo)
      env PIN=roles ROUNDS=3 NUM_PROMPTS=${NUM_PROMPTS:-12} PER_CONC=${PER_CONC:-12} MAX_PROMPTS=${MAX_PROMPTS:-512} \
        LEVELS=${LEVELS:-1,4,16,64,256} SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-80} PORT=30300 \
        bash benchmark/spec_envelope_gpu.sh "$P" demo no_draft always dynamic always_b
      python -m sglang.benchmark.envelope --dynamic "$P/demo_dynamic.jsonl" --static no_draft="$P/demo_no_draft.jsonl" \
        --static always="$P/demo_always.jsonl" --aa always="$P/demo_always_b.jsonl" --out "$P/report.json" \
        > "$OUT/$part.txt" 2>&1 ;;
  esac
  for t in "$P"/*_servers.tgz; do  # each speculative server's start-up table (the prior), first 300 characters
    for log in $(tar tzf "$t" | grep 'server.log$'); do
      echo "$log: $(tar xzf "$t" -O "$log" | grep -o 'cost table.*' | cut -c1-300)" >> "$OUT/$part.txt"
    done
  done
  cat "$OUT/$part.txt"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/$part.txt" 2>&1
  (cd "$OUT" && tar czf "$part.tgz" "$part" && rm -rf "$part")
done
