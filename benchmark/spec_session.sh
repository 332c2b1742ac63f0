#!/usr/bin/env bash
# One device call for the speculative path: its GPU tests, its speed on the demo pair (one run
# with plain decoding as the reference), and a host-side profile of a few levels.
#   bash benchmark/spec_session.sh $OUT [BATCH_SIZES]
set -u -o pipefail
OUT=${1:?usage: spec_session.sh OUT [BATCH_SIZES]}
BS=${2:-1,2,4,8,16,32,64,128,256}
mkdir -p "$OUT/profile"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt"
timeout 240 python -m pytest test/gpu/test_spec_cuda.py -q -x 2>&1 | tail -15 | tee "$OUT/spec_tests.log"
timeout 200 python benchmark/spec_speed.py --pair demo --batch-sizes "$BS" --steps 3 --out "$OUT/spec_demo.json" 2>&1 | tail -20
SPEC_SPEED_PROFILE=$OUT/profile timeout 100 python benchmark/spec_speed.py --pair demo --batch-sizes 1,64 --steps 3 \
  --out "$OUT/profile/spec_demo_profiled.json" 2>&1 | tail -4
