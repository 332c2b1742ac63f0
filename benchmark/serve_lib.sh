# Shell functions the GPU scripts share (sourced): is a server on a port healthy, and waiting
# for one to be.

healthy() {  # PORT
  python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=5).status != 200)" 2>/dev/null
}

wait_healthy() {  # PID PORT LOG DEADLINE_S: 0 once /health answers; else prints why and the log's tail, 1
  local pid=$1 port=$2 log=$3 deadline=$4 start=$SECONDS
  until healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "server exited before /health answered; its log:"; tail -50 "$log"; return 1
    fi
    if (( SECONDS - start > deadline )); then
      echo "no /health on port $port within ${deadline} s; server log:"; tail -50 "$log"; return 1
    fi
    sleep 2
  done
}

demo_pair() {  # sets MODEL and DRAFT to the shipped demo pair, SPEC to the EAGLE-3 flags (k = 3) for it
  MODEL=$(python -c "from sglang import demo; print(demo.TARGET_PATH)")
  DRAFT=$(python -c "from sglang import demo; print(demo.DRAFT_PATH)")
  SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3"
}

save_server_info() {  # PORT FILE: the server's /get_server_info (no file when it does not answer)
  python -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$1/get_server_info', timeout=10).read().decode())" \
    > "$2" 2>/dev/null || rm -f "$2"
}

bench_args() {  # fills BENCH_ARGS: bench_serving's data and level options from the environment
  # (DATASET_PATH or random ids at INPUT_LEN; OUTPUT_LEN, NUM_PROMPTS, PER_CONC, MAX_PROMPTS, LEVELS)
  if [ -n "${DATASET_PATH:-}" ]; then  # prompts from a file (ShareGPT layout), fixed output length
    BENCH_ARGS=(--dataset-name sharegpt --dataset-path "$DATASET_PATH" --sharegpt-output-len "${OUTPUT_LEN:-128}")
  else
    BENCH_ARGS=(--dataset-name random --random-input-len "${INPUT_LEN:-1024}" --random-output-len "${OUTPUT_LEN:-128}"
      --random-range-ratio 1)
  fi
  BENCH_ARGS+=(--num-prompts "${NUM_PROMPTS:-64}" --prompts-per-concurrency "${PER_CONC:-4}"
    ${MAX_PROMPTS:+--max-prompts-per-level "$MAX_PROMPTS"} --max-concurrency "${LEVELS:-1,2,4,8,16,32,64,128,256}"
    --warmup-requests 8 --flush-cache --disable-tqdm)
}

start_monitor() {  # FILE_PREFIX: samples, every 250 ms until stop_monitor, what may set a host-bound
  # server's speed: the GPU's clocks, power and utilization (nvidia-smi, read-only) into
  # PREFIX.gpu.csv, the CPUs' mean / min / max MHz and the load average into PREFIX.cpu.csv, and
  # the CPU seconds used so far by each server process (sglang-http / -sched / -detok, keyed by
  # the server's port) and by the benchmark client into PREFIX.procs.csv
  MONITOR_PIDS=()
  python - "$1.procs.csv" <<'PY' &
import os, sys, time
tick = os.sysconf("SC_CLK_TCK")

def read(pid, name):
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()

def port_of(cmdline):
    args = cmdline.split(b"\0")
    return int(args[args.index(b"--port") + 1]) if b"--port" in args[:-1] else 0

with open(sys.argv[1], "w") as out:
    out.write("time,pid,role,port,cpu_s\n")
    while True:
        now = time.time()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = read(pid, "stat")
                comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
                fields = stat[stat.rindex(b")") + 2:].split()
                if comm.startswith("sglang-"):
                    role = comm[len("sglang-"):]
                    owner = pid if role == "http" else fields[1].decode()  # children: their parent's port
                    port = port_of(read(owner, "cmdline"))
                elif b"interleaved_sweep" in read(pid, "cmdline") or b"bench_serving" in read(pid, "cmdline"):
                    role, port = "client", 0
                else:
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, ValueError, IndexError):
                continue
            out.write(f"{now:.3f},{pid},{role},{port},{cpu:.2f}\n")
        out.flush()
        time.sleep(0.25)
PY
  MONITOR_PIDS+=($!)
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.current.sm,clocks.current.memory,power.draw,utilization.gpu,pstate,temperature.gpu \
      --format=csv -lms 250 > "$1.gpu.csv" 2>/dev/null &
    MONITOR_PIDS+=($!)
  fi
  python - "$1.cpu.csv" <<'PY' &
import sys, time
with open(sys.argv[1], "w") as out:
    out.write("time,mhz_mean,mhz_min,mhz_max,load1\n")
    while True:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        if mhz:
            out.write(f"{time.time():.3f},{sum(mhz) / len(mhz):.0f},{min(mhz):.0f},{max(mhz):.0f},{load}\n")
        out.flush()
        time.sleep(0.25)
PY
  MONITOR_PIDS+=($!)
}

stop_monitor() {
  kill "${MONITOR_PIDS[@]}" 2>/dev/null
}

cpu_sets() {  # N: N + 1 lines, the CPU lists for N servers and then a client (benchmark/cpu_sets.py)
  python benchmark/cpu_sets.py servers "$1"
}

role_cpu_sets() {  # 4 lines: the CPU lists for every server's HTTP process, scheduler and detokenizer,
  # and for the client (benchmark/cpu_sets.py)
  python benchmark/cpu_sets.py roles
}

pin_roles() {  # PID HTTP_CPUS SCHED_CPUS DETOK_CPUS: every thread of the server launched as PID (its
  # HTTP process) and of its scheduler and detokenizer children onto the CPUs of its role; threads
  # started later inherit it. 1 if a process is missing.
  local child comm found=0
  taskset -a -p -c "$2" "$1" > /dev/null || return 1
  for child in $(pgrep -P "$1"); do
    comm=$(cat "/proc/$child/comm" 2>/dev/null)
    case "$comm" in
      sglang-sched) taskset -a -p -c "$3" "$child" > /dev/null && found=$(( found + 1 )) ;;
      sglang-detok) taskset -a -p -c "$4" "$child" > /dev/null && found=$(( found + 1 )) ;;
    esac
  done
  (( found == 2 ))
}
