#!/usr/bin/env bash
# Puts another revision's `sglang` package (without the demo pair's weights, which the
# benchmarks take from the current tree) under .device/baseline/python, which every device call
# carries with .device: `spec_speed.py --baseline-python .device/baseline/python` then runs that
# code beside the current code in the same call (gpu_session.sh part ab).
#
#   bash benchmark/stage_baseline.sh REV
set -euo pipefail
REV=${1:?usage: stage_baseline.sh REV}
rm -rf .device/baseline && mkdir -p .device/baseline
git archive "$REV" python/sglang | tar -x -C .device/baseline \
  --exclude='python/sglang/demo/target' --exclude='python/sglang/demo/draft'
git rev-parse "$REV" > .device/baseline/REV
echo "baseline $(cat .device/baseline/REV) staged in .device/baseline/python ($(du -sh .device/baseline | cut -f1))"
