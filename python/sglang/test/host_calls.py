"""How many torch calls the host makes per scheduler pass, by pass kind and phase, on the CPU.

On a GPU host each torch call on a few values costs the host 5-30 us, and
a small model's server is bound by its host: the number of calls per pass is what sets its
speed, and unlike a time it can be counted exactly on any machine. Here the real Scheduler runs
the demo pair on the CPU with every CUDA graph replaced by a stand-in that re-runs its forward
(sglang.test.runner_utils.fake_cuda_graphs), so everything around the graphs runs as it does on
CUDA; calls made inside a replay are not counted (on CUDA they are one graph launch). A decode
batch of 8 runs while one new request arrives every three passes, so prefill passes of one
request interleave with decode passes as they do in a loaded server. Prefill graphs are captured
up to 128 tokens (every prefill here is of 64-token requests, at most two per pass): with the
server's default, 2048, the capture alone runs 75 forwards of up to 2048 tokens (1.5 minutes
on the CPU) and every count, call site by call site, comes out the same.

    python -m sglang.test.host_calls [--server always|dynamic|no_draft] [--sites] [--out FILE]

Counts are per pass: `launch` is the worker's forward (what the scheduler launches), `other`
the rest of the pass (schedule, process, collect). `--sites` also lists the call sites.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import traceback

import torch
from torch.overrides import TorchFunctionMode

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test import runner_utils


class _Counter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.phase = None  # (pass kind, "launch" or "other"), None: not counting
        self.in_replay = 0
        self.calls = collections.Counter()
        self.sites = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.phase is not None and not self.in_replay:
            self.calls[self.phase] += 1
            name = getattr(func, "__name__", str(func))
            stack = traceback.extract_stack(limit=8)[:-1]
            site = next((f for f in reversed(stack) if "/sglang/" in f.filename), stack[-1])
            self.sites[self.phase, f"{site.filename.split('/sglang/')[-1]}:{site.lineno} {name}"] += 1
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))


def count(server: str, passes: int = 24, set_attr=setattr, prefill_graph_tokens: int = 128) -> dict:
    """{"passes": {kind: n}, "calls": {"KIND/PHASE": calls per pass}, "sites": {...}}. The graph
    stand-ins are put in place through `set_attr` (a test passes monkeypatch.setattr);
    `prefill_graph_tokens` is the server's --prefill-cuda-graph-max-tokens."""
    runner_utils.fake_cuda_graphs(set_attr, [1, 2, 4, 8, 16])
    counter = _Counter()
    for cls in (runner_utils.RerunGraph, runner_utils.RerunStepGraph):
        replay = cls.replay

        def counted(self, replay=replay):
            counter.in_replay += 1
            try:
                return replay(self)
            finally:
                counter.in_replay -= 1

        set_attr(cls, "replay", counted)
    spec = (
        {}
        if server == "no_draft"
        else dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=demo.DRAFT_PATH,
            speculative_num_steps=3,
            speculative_policy="always" if server == "always" else "cost",
        )
    )
    scheduler = Scheduler(
        ServerArgs(
            model_path=demo.TARGET_PATH,
            device="cpu",
            max_running_requests=16,
            cuda_graph_max_bs=16,
            log_level="warning",
            prefill_cuda_graph_max_tokens=prefill_graph_tokens,
            **spec,
        )
    )
    rng = random.Random(0)

    def add(i: int) -> None:
        ids = [rng.randrange(10, 1000) for _ in range(64)]
        params = SamplingParams(max_new_tokens=400, temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=True))

    for i in range(8):
        add(i)
    for _ in range(6):  # every request prefilled, and a few decode steps
        scheduler.step()
    launch = scheduler._launch
    kind = [None]

    def counted_launch(batch, *args):
        outer, counter.phase = counter.phase, (kind[0], "launch")
        try:
            return launch(batch, *args)
        finally:
            counter.phase = outer

    scheduler._launch = counted_launch
    made = collections.Counter()
    with counter:
        for j in range(passes):
            if j % 3 == 0:
                add(100 + j)
            kind[0] = "prefill" if scheduler.waiting_queue else "decode"
            made[kind[0]] += 1
            counter.phase = (kind[0], "other")
            scheduler.step()
            counter.phase = None
    return {
        "server": server,
        "passes": dict(made),
        "calls": {f"{k}/{phase}": round(n / made[k], 1) for (k, phase), n in sorted(counter.calls.items())},
        "sites": {
            f"{k}/{phase} {site}": round(n / made[k], 1)
            for ((k, phase), site), n in sorted(counter.sites.items(), key=lambda x: -x[1])
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["always", "dynamic", "no_draft"], default="always")
    parser.add_argument("--sites", action="store_true", help="also each call site's calls per pass")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = count(args.server)
    print(f"{args.server}: passes {result['passes']}")
    for name, n in result["calls"].items():
        print(f"  {name:16} {n:6.1f} torch calls per pass")
    if args.sites:
        for site, n in result["sites"].items():
            if n >= 0.5:
                print(f"    {n:5.1f}  {site}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
