source .device/env.sh
export PYTHONUNBUFFERED=1
timeout 150 python -m pytest test/gpu/test_spec_cuda.py -x -q 2>&1 | tail -15 | tee $OUT/spec_cuda_tests.log
SWEEP_TIMEOUT_S=170 bash benchmark/spec_envelope_gpu.sh $OUT 8b-acc3 dynamic 2>&1 | grep -v "^\s*$" | tail -6
SWEEP_TIMEOUT_S=170 bash benchmark/spec_envelope_gpu.sh $OUT 8b-acc2 dynamic 2>&1 | grep -v "^\s*$" | tail -6
for f in $OUT/*.jsonl; do python -c "
import json,sys
for l in open('$f'):
    r=json.loads(l); print('$f'.split('/')[-1], r['max_concurrency'], round(r['output_throughput']), r.get('accept_length'), r.get('spec_step_share_by_k'))"; done
