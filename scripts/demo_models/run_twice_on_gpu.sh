#!/usr/bin/env bash
# Runs the demo pipeline twice with the same seed, side by side on one GPU (the models are small
# enough that the two runs barely slow each other), so that the reproducibility of the held-out
# losses is checked in the same device call that makes the pair. Leaves in WORK/ret: run A's
# pair packed and split into <= 15 MB pieces (the device tool's limit per returned file) and
# runs.tgz with both logs and reports; WORK/done marks the end.
#   DEMO_WORK=/tmp/demo_runs scripts/demo_models/run_twice_on_gpu.sh [extra pipeline flags...]
set -u
work=${DEMO_WORK:-/tmp/demo_runs}
rm -rf "$work"; mkdir -p "$work/ret"
here=$(dirname "$0")
# Half the cores each: two processes spinning on all of them slow each other down a hundredfold.
threads=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
for run in a b; do
  OMP_NUM_THREADS=$threads RAYON_NUM_THREADS=$threads PYTHONUNBUFFERED=1 python "$here/pipeline.py" --out "$work/$run" --seed 0 "$@" >"$work/$run.log" 2>&1 &
done
wait
tar -C "$work" -czf "$work/ret/runs.tgz" a.log b.log $(cd "$work" && ls a/report.json a/README.md b/report.json 2>/dev/null)
if [ -f "$work/a/report.json" ]; then
  tar -C "$work/a" -czf "$work/pair.tgz" target draft README.md report.json
  split -b 15m -d "$work/pair.tgz" "$work/ret/pair.tgz.part"
fi
touch "$work/done"
