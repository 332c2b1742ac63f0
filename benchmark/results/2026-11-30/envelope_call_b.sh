source .device/env.sh
export PYTHONUNBUFFERED=1
timeout 100 python -m pytest test/gpu/test_spec_cuda.py -x -q -k "switching" 2>&1 | tail -15 | tee $OUT/spec_cuda_tests.log
grep -q " passed" $OUT/spec_cuda_tests.log && ! grep -q "failed\|error" $OUT/spec_cuda_tests.log || exit 1
SWEEP_TIMEOUT_S=150 bash benchmark/spec_envelope_gpu.sh $OUT 8b-acc3 dynamic 2>&1 | grep -v "^\s*$" | tail -4
SWEEP_TIMEOUT_S=150 bash benchmark/spec_envelope_gpu.sh $OUT 8b-acc2 dynamic 2>&1 | grep -v "^\s*$" | tail -4
mkdir -p $OUT/plain && LEVELS=64,256 SWEEP_TIMEOUT_S=90 bash benchmark/spec_envelope_gpu.sh $OUT/plain 8b-acc3 no_draft never_warm never_catch_up 2>&1 | grep -v "^\s*$" | tail -12
for f in $OUT/*.jsonl $OUT/plain/*.jsonl; do python -c "
import json,sys
for l in open('$f'):
    r=json.loads(l); print('$f'.split('/')[-1], r['max_concurrency'], round(r['output_throughput']), r.get('accept_length'), r.get('spec_step_share_by_k'))"; done
