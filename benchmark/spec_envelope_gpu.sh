#!/usr/bin/env bash
# The envelope of dynamic speculation (issue 8) on the GPU machine: three servers on one model
# (no draft; always EAGLE-3 at k = 3; dynamic with the default policy), each swept over
# concurrency 1..256 with bench_serving, then the envelope report and one plot of the three.
#
#   bash benchmark/spec_envelope_gpu.sh OUT CONFIG
#
# CONFIG: 8b-acc2 / 8b-acc3 (Llama-3.1-8B shapes, random weights, a random 8B-shaped EAGLE-3
# draft, SGLANG_SIMULATE_ACC_LEN 2.0 / 3.0 for the speculative servers) or demo (the shipped
# pair with its real acceptance). Each config is ~3 server starts + 3 sweeps; give it its own
# device call. Env: LEVELS, INPUT_LEN, OUTPUT_LEN, NUM_PROMPTS, PER_CONC (as serving_sweep_gpu.sh;
# defaults here: input 1024, output 128, 16 prompts + 2 per unit of concurrency).
set -u -o pipefail
OUT=${1:?usage: spec_envelope_gpu.sh OUT CONFIG}
CONFIG=${2:?usage: spec_envelope_gpu.sh OUT CONFIG}
WORK=/tmp/spec_envelope
mkdir -p "$OUT" "$WORK"
export NUM_PROMPTS=${NUM_PROMPTS:-16} PER_CONC=${PER_CONC:-2} SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-170}
case "$CONFIG" in
  8b-acc2|8b-acc3)
    python - <<'PY' || exit 1
import os, sys
sys.path.insert(0, "benchmark")
from spec_speed import make_pair
make_pair("8b", "/tmp/spec_envelope")
PY
    MODEL=$WORK/llama-3.1-8b; DRAFT=$WORK/llama-3.1-8b-eagle3
    ACC=${CONFIG#8b-acc}; SIM="SGLANG_SIMULATE_ACC_LEN=$ACC.0" ;;
  demo)
    MODEL=$(python -c "from sglang import demo; print(demo.TARGET_PATH)")
    DRAFT=$(python -c "from sglang import demo; print(demo.DRAFT_PATH)")
    SIM="" ;;
  *) echo "unknown config $CONFIG (8b-acc2, 8b-acc3, demo)"; exit 2 ;;
esac
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $DRAFT --speculative-num-steps 3"
run() {  # name, extra env, server args
  env NAME="${CONFIG}_$1" LABEL="$1" TITLE="envelope $CONFIG" SERVER_ARGS="$3" $2 \
    bash benchmark/serving_sweep_gpu.sh "$OUT" "$MODEL" 2>&1 | tail -4
}
run no_draft "" ""
run always "$SIM" "$SPEC"
run dynamic "$SIM" "$SPEC --speculative-adaptive"
python benchmark/spec_envelope_report.py --no-draft "$OUT/${CONFIG}_no_draft.jsonl" \
  --always "$OUT/${CONFIG}_always.jsonl" --dynamic "$OUT/${CONFIG}_dynamic.jsonl" \
  --server-info "$OUT/${CONFIG}_dynamic.server_info.json" --out "$OUT/${CONFIG}_envelope.json"
python -m sglang.bench_serving plot "$OUT/${CONFIG}_no_draft.jsonl" "$OUT/${CONFIG}_always.jsonl" \
  "$OUT/${CONFIG}_dynamic.jsonl" --output "$OUT/${CONFIG}_envelope.png" --title "envelope $CONFIG, 1 x H200"
# At most 8 files come back from a device call: the sweeps' JSONL, the report and the plot stay
# loose; the server logs and /get_server_info snapshots go into one archive.
rm -f "$OUT"/${CONFIG}_{no_draft,always,dynamic}.png
(cd "$OUT" && tar czf "${CONFIG}_servers.tgz" ${CONFIG}_*.server.log ${CONFIG}_*.server_info.json 2>/dev/null \
  && rm -f ${CONFIG}_*.server.log ${CONFIG}_*.server_info.json)
