#!/usr/bin/env bash
# The next GPU session's device calls, one part per call (each fits the 600 s limit of a call
# and returns at most 8 files). Run from the repository root on the GPU machine, after
# `source .device/env.sh` (plan and expectations: benchmark/README.md):
#
#   bash benchmark/gpu_session.sh PART $OUT
#
# env-8b-acc3   issue 8's envelope on 8B shapes at simulated accept length 3.0: no draft, always
#               k = 3, dynamic, one run (~7.5 min); report + plot
# env-8b-acc2   the same at 2.0
# env-demo      the same on the demo pair with its real acceptance (code prompts): the three servers
#               up at once, measured in turn at every level, two rounds (A B C, C B A; ~5 min);
#               ENVELOPE_SERVERS picks the servers (e.g. "no_draft always dynamic always_b" with the
#               A/A control, or "no_draft always dynamic dynamic_b always_b" for two instances of each
#               kind, judged pooled), PIN=roles pins every server alike (spec_envelope_gpu.sh)
# check         pytest test/gpu/test_spec_cuda.py (speculative graphs, switching, requests the draft
#               does not follow), then spec_speed --off-state (prefill and decode speed, no draft /
#               never + warm / never + catch-up)
# offstate      what a loaded, unused draft costs: no draft and policy never at concurrency 64, 256
# phases        issue 6's phase split (draft / verify / extend) at batch 1..256, both pairs
# noise         where the demo pair's run-to-run spread comes from: default, OMP_NUM_THREADS=1 and
#               pinned no-draft servers, six interleaved rounds at concurrency 1, 8, 64, with the
#               GPU's and CPUs' clocks per round (noise_probe_gpu.sh; ~6 min)
# prefill       what admitting 1 / 4 requests costs a running batch of 16, no draft and k = 3, demo pair
#               (input 256) and 8B shapes (input 1024): prefill_cost.py (~3 min)
# prefillgraphs prefill CUDA graphs: their GPU tests (replay = eager prefill, plain and EAGLE-3; no launch
#               waits for the device), then prefill_cost.py with prefill graphs off and on (2048 tokens),
#               demo pair and 8B shapes, input 256 (~7 min)
# hostprof      the scheduler's host profile under serving load, demo pair, always k = 3 and no draft,
#               concurrency 1 and 16 (host_profile_gpu.sh; ~2 min)
# spy           where each demo server's scheduler and HTTP process spend their host time under load (py-spy
#               returned no real samples on the GPU machine in session 12: throughputs only there)
#               (always, dynamic, no draft at concurrency 1, 4 and 64), sampled with py-spy (sched_spy_gpu.sh;
#               ~3 min; stage py-spy with stage_device_extras.sh); read with spy_report.py
# aa            are identical demo servers equally fast? always, always_b, always_c one at a time (each alone on
#               the machine), then the same in the reverse order, levels 8 and 32 with ~8 s each (~7 min);
#               one table of tok/s and TPOT per server, order and level; everything in aa.tgz.
#               Env: AA_LEVELS (8,32), AA_PER_CONC (192), AA_MAX (2048), AA_NUM (768)
# tests         pytest test/gpu (kernels, sampling, speculative graphs, switching)
# host          how fast each CPU runs the same Python, alone and all at once, and fresh processes on one CPU
#               (cpu_speed_probe.py); what each small host operation of a step costs (host_ops_gpu.py), then the
#               demo pair's decode in-process (no HTTP): no draft, always k = 3 and dynamic at batch 1..256,
#               each in two processes in turn, every pass timed by phase (spec_speed.py --step-times; ~3 min)
# ab-code       the current code against another revision's (benchmark/stage_baseline.sh REV first), in-process
#               on the demo pair: no draft, always k = 3 and dynamic, each run of each variant made with both trees
#               in turn, every process pinned to CPU AB_CPU (8) (spec_speed.py --baseline-python; ~6 min);
#               step_times_report.py's table with current / baseline per level
# ab-loop       as ab-code, in a loaded server's steady state without its front end (spec_speed --closed-loop:
#               no draft and always k = 3 at concurrency LOOP_LEVELS (16,64,256), finished requests replaced at once,
#               so prefill passes of a few requests interleave with decode steps; ~5 min)
# timing        issue 4: gpu_check exactness / floor / bench / profile (greedy fp32 output across
#               backends, graphs and overlap; the floor ratio; where the batch-1 step goes)
# peers         issue 4: our decode step (gpu_check bench) and gpt-fast at batch 8, then batch 1,
#               in one call (gpt-fast compiles ~130 s per batch size); carry .peers
# skinny        issue 4: sgl_kernel.skinny_gemm's launch-shape sweep against cuBLAS on 8B's layers, then
#               gpu_check bench with the kernel off and on
# ab            issue 4: the skinny kernel's GPU tests, then the decode step with cuBLAS only against
#               skinny_gemm where faster (one process, interleaved rounds), then the batch-1 profile
# gptfast       gpt-fast at batch 8 alone; carry .peers
set -u -o pipefail
PART=${1:?usage: gpu_session.sh PART OUT}
OUT=${2:?usage: gpu_session.sh PART OUT}
mkdir -p "$OUT"
{ git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; } > "$OUT/run_info_$PART.txt"

case "$PART" in
  env-8b-acc3|env-8b-acc2|env-demo)
    default_timeout=150; [ "$PART" = env-demo ] && default_timeout=160
    SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-$default_timeout} bash benchmark/spec_envelope_gpu.sh "$OUT" "${PART#env-}" \
      ${ENVELOPE_SERVERS:-} 2>&1 \
      | grep -v "^\s*$" | tail -40 | tee "$OUT/envelope.log"
    ;;
  check)
    timeout 300 python -m pytest test/gpu/test_spec_cuda.py -q 2>&1 | tail -15 | tee "$OUT/gpu_spec_tests.log"
    timeout 250 python benchmark/spec_speed.py --pair 8b --off-state --input-len 1024 --output-len 128 \
      --batch-sizes 1,8,64,256 --workdir /tmp/spec_envelope --out "$OUT/off_state.json" 2>&1 | tail -14
    ;;
  offstate)
    LEVELS=64,256 SWEEP_TIMEOUT_S=120 bash benchmark/spec_envelope_gpu.sh "$OUT" 8b-acc3 no_draft never_warm \
      2>&1 | grep -v "^\s*$" | tail -12
    ;;
  phases)
    timeout 250 python benchmark/spec_speed.py --pair 8b --disable-step-graph --batch-sizes 1,2,4,8,16,32,64,128,256 \
      --workdir /tmp/spec_envelope --out "$OUT/phases_8b.json" 2>&1 | tail -12
    timeout 150 python benchmark/spec_speed.py --pair demo --disable-step-graph --batch-sizes 1,2,4,8,16,32,64,128,256 \
      --out "$OUT/phases_demo.json" 2>&1 | tail -12
    ;;
  noise)
    bash benchmark/noise_probe_gpu.sh "$OUT" 2>&1 | tail -24
    ;;
  prefill)
    timeout 200 python benchmark/prefill_cost.py --pair demo --out "$OUT/prefill_cost_demo.json" 2>&1 | tail -5
    timeout 300 python benchmark/prefill_cost.py --pair 8b --input-len 1024 --out "$OUT/prefill_cost_8b.json" 2>&1 | tail -5
    ;;
  prefillgraphs)
    timeout 240 python -m pytest test/gpu/test_spec_cuda.py -q -s -k "prefill or launches or replay_and_match" 2>&1 \
      | grep -v "^\s*$" | tail -20 | tee "$OUT/gpu_prefill_graph_tests.log"
    timeout 200 python benchmark/prefill_cost.py --pair demo --new 1,4 --repeats 12 \
      --out "$OUT/prefill_graphs_demo.json" 2>&1 | tail -9
    timeout 240 python benchmark/prefill_cost.py --pair 8b --new 1,4 --repeats 8 \
      --out "$OUT/prefill_graphs_8b.json" 2>&1 | tail -9
    ;;
  hostprof)
    timeout 230 bash benchmark/host_profile_gpu.sh "$OUT" 2>&1 | tail -12
    ;;
  spy)
    SPY_HTTP=1 NATIVE=${NATIVE:-0} timeout 420 bash benchmark/sched_spy_gpu.sh "$OUT" 2>&1 | grep -v "^\s*$" | tail -30
    ;;
  aa)
    for order in "always always_b always_c" "always_c always_b always"; do
      dir=$OUT/$( [ "${order%% *}" = always ] && echo forward || echo reverse )
      STEP_TIMES=1 ROUNDS=0 LEVELS=${AA_LEVELS:-8,32} NUM_PROMPTS=${AA_NUM:-768} PER_CONC=${AA_PER_CONC:-192} \
        MAX_PROMPTS=${AA_MAX:-2048} SWEEP_TIMEOUT_S=90 bash benchmark/spec_envelope_gpu.sh "$dir" demo $order 2>&1 \
        | grep "^== \|failed" | tee -a "$OUT/aa.log"
    done
    python - "$OUT" <<'PY' | tee -a "$OUT/aa.log"
import json, pathlib, sys
print(f"{'order':8} {'server':16} {'conc':>5} {'tok/s':>9} {'TPOT ms':>8} {'s':>6}")
for order in ("forward", "reverse"):
    for path in sorted(pathlib.Path(sys.argv[1], order).glob("demo_always*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            print(f"{order:8} {path.stem:16} {row['max_concurrency']:>5} {row['output_throughput']:>9.0f} "
                  f"{row['mean_tpot_ms']:>8.3f} {row['duration']:>6.1f}")
PY
    { echo "transparent hugepages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
      for d in "$OUT"/forward "$OUT"/reverse; do
        mkdir -p "$d/x" && tar xzf "$d/demo_servers.tgz" -C "$d/x" 2>/dev/null
        for f in "$d"/x/*.steps.*.txt; do [ -f "$f" ] && { echo "== ${d##*/} ${f##*/}"; grep "spec_k3" "$f"; }; done
        for f in "$d"/x/*.procstat; do
          [ -f "$f" ] && awk -v n="${d##*/} ${f##*/}" '/^cpu /{for(i=2;i<=NF;i++){v[NR,i]=$i}; r[++c]=NR}
            END{t=0; for(i=2;i<=9;i++) t+=v[r[2],i]-v[r[1],i]; s=v[r[2],9]-v[r[1],9];
                printf "== %s steal %.2f%% of CPU time\n", n, t ? 100*s/t : 0}' "$f"
        done
        rm -rf "$d/x"
      done; } 2>&1 | tee -a "$OUT/aa.log"
    (cd "$OUT" && tar czf aa.tgz forward reverse aa.log && rm -rf forward reverse aa.log)
    ;;
  tests)
    timeout 560 python -m pytest test/gpu -q 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
    ;;
  host)
    timeout 90 python benchmark/cpu_speed_probe.py --out "$OUT/cpu_speed.json" 2>&1 | tail -20
    timeout 120 python benchmark/host_ops_gpu.py --out "$OUT/host_ops.json" 2>&1 | tail -30
    timeout 400 python benchmark/spec_speed.py --pair demo --input-len 256 --output-len 256 \
      --batch-sizes ${HOST_LEVELS:-1,4,16,64,256} --dynamic --step-times --repeats ${HOST_REPEATS:-2} \
      --out "$OUT/sched_steps_demo.json" 2>&1 | grep -v "^\s*$" | tail -80 | tee "$OUT/sched_steps_demo.log"
    ;;
  ab-code)
    [ -d .device/baseline/python ] || { echo "no baseline: run benchmark/stage_baseline.sh REV first"; exit 2; }
    echo "baseline $(cat .device/baseline/REV)"
    timeout 540 python benchmark/spec_speed.py --pair demo --input-len 256 --output-len 256 \
      --batch-sizes ${HOST_LEVELS:-1,4,16,64,256} --dynamic --step-times --repeats ${HOST_REPEATS:-2} \
      --baseline-python .device/baseline/python --cpu ${AB_CPU:-8} \
      --out "$OUT/ab_code_demo.json" 2>&1 | grep -v "^\s*$\|^    run" | tail -70
    python benchmark/step_times_report.py "$OUT/ab_code_demo.json" | tee "$OUT/ab_code_demo.txt"
    ;;
  ab-loop)
    # The current tree against stage_baseline.sh's in a loaded server's steady state without its
    # front end (spec_speed --closed-loop: prefill passes of a few requests between decode steps,
    # as a served load at high concurrency has), interleaved, pinned to one CPU.
    [ -d .device/baseline/python ] || { echo "no baseline: run benchmark/stage_baseline.sh REV first"; exit 2; }
    echo "baseline $(cat .device/baseline/REV)"
    timeout 540 python benchmark/spec_speed.py --pair demo --input-len 256 --output-len 128 \
      --batch-sizes ${LOOP_LEVELS:-16,64,256} --closed-loop ${LOOP_ROUNDS:-4} --step-times --repeats ${HOST_REPEATS:-2} \
      --baseline-python .device/baseline/python --cpu ${AB_CPU:-8} \
      --out "$OUT/ab_loop_demo.json" 2>&1 | grep -v "^\s*$\|^    run" | tail -70
    python benchmark/step_times_report.py "$OUT/ab_loop_demo.json" | tee "$OUT/ab_loop_demo.txt"
    ;;
  timing)
    timeout 280 python benchmark/gpu_check.py --workdir /tmp/spec_envelope --out "$OUT" \
      --parts exactness,floor,bench,profile 2>&1 | tail -14
    ;;
  skinny)
    timeout 200 python benchmark/skinny_gemm_bench.py --out "$OUT/skinny_gemm_bench.json" 2>&1 | grep -v "^  " | tail -26
    for off in 1 0; do
      SGLANG_DISABLE_SKINNY_GEMM=$off timeout 150 python benchmark/gpu_check.py --workdir /tmp/spec_envelope \
        --out "$OUT/skinny_off$off" --parts bench 2>&1 | grep "bs \|failed"
    done
    ;;
  ab)
    timeout 90 python -m pytest test/gpu/test_kernels_cuda.py -q -k "skinny or synchronize" 2>&1 | tail -3 | tee "$OUT/gpu_kernel_tests.log"
    timeout 200 python benchmark/skinny_ab.py --workdir /tmp/spec_envelope --out "$OUT/skinny_ab.json" 2>&1 | grep "^bs \|Error"
    timeout 120 python benchmark/gpu_check.py --workdir /tmp/spec_envelope --out "$OUT" --parts profile 2>&1 | grep "profile\|failed"
    ;;
  peers)
    timeout 120 python benchmark/gpu_check.py --workdir /tmp/spec_envelope --out "$OUT" --parts floor,bench 2>&1 | tail -5
    for bs in 8 1; do
      timeout $(( bs == 8 ? 300 : 150 )) python benchmark/peer_gpt_fast.py --gpt-fast-dir .peers/gpt-fast --batch-sizes $bs \
        --input-len 1024 --steps 128 --out "$OUT/peer_gpt_fast_bs$bs.json" 2>&1 | tail -4
    done
    ;;
  gptfast)
    timeout 500 python benchmark/peer_gpt_fast.py --gpt-fast-dir .peers/gpt-fast --batch-sizes 8 --input-len 1024 \
      --steps 128 --out "$OUT/peer_gpt_fast_bs8.json" 2>&1 | tail -10
    ;;
  *)
    echo "unknown part $PART (env-8b-acc3, env-8b-acc2, env-demo, check, offstate, phases, spy, aa, tests, host, ab-code, timing, peers, gptfast)"; exit 2 ;;
esac
