source .device/env.sh
export PYTHONUNBUFFERED=1
python -c "
import sys; sys.path.insert(0, 'benchmark')
from spec_speed import make_pair; make_pair('8b', '/tmp/spec_envelope')" 2>&1 | tail -2
cat > /tmp/mk.py <<'PY'
import os, sys, traceback
from sglang.srt.server_args import ServerArgs
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.speculative import eagle_worker_v2 as W
orig = W.EAGLEWorkerV2.measure_step_costs
def _m(self, repeats=3):
    import torch
    og = self._seconds_per_call
    n = [0]
    def wrapped(run, r):
        n[0] += 1
        print("call", n[0], flush=True)
        return og(run, r)
    self._seconds_per_call = wrapped
    return orig(self, repeats)
W.EAGLEWorkerV2.measure_step_costs = _m
try:
    s = Scheduler(ServerArgs(model_path='/tmp/spec_envelope/llama-3.1-8b', speculative_algorithm='EAGLE3',
                             speculative_draft_model_path='/tmp/spec_envelope/llama-3.1-8b-eagle3', speculative_num_steps=3,
                             speculative_adaptive=True, max_running_requests=256, **eval(sys.argv[1])))
    print("OK", s.spec_policy.summary())
except Exception:
    traceback.print_exc()
PY
for extra in "dict(cuda_graph_bs=[1,2,4,8,16])" "{}"; do
  for sim in 3.0; do
  echo "=== $extra sim=$sim"; SGLANG_SIMULATE_ACC_LEN=$sim CUDA_LAUNCH_BLOCKING=1 timeout 150 python /tmp/mk.py "$extra" 2>&1 | grep -v "^\s*$" | grep -v "captured" | tail -30
  done
done
