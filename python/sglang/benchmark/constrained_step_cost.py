"""What a constrained decode step costs against an unconstrained one, plain and speculative, through
the real Scheduler in-process (structured outputs: the grammar's mask is filled on the host for
every constrained request each step, and a constrained batch neither pipelines nor replays the
whole-step graphs).

    python -m sglang.benchmark.constrained_step_cost --out $OUT/constrained_step_cost.json [--batch 1,64]
        [--steps 48] [--device cuda]

With no draft and with the demo pair's EAGLE-3 draft at k = 3 (policy `always`; one scheduler
each), for each batch size, with every request unconstrained or every request constrained by a
JSON schema that keeps it writing (an array of at least 64 objects), the requests are admitted,
then --steps decode steps are timed after 8 warm-up steps (then the requests are aborted). Reported per configuration: step_ms (mean wall time
of a decode step, host and device), tokens_per_step (per request), tokens_per_s (all requests), and
constrained_over_unconstrained (the step time ratio at the same batch and mode)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

SCHEMA = json.dumps(
    {
        "type": "array",
        "minItems": 64,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string", "maxLength": 16},
                "ok": {"type": "boolean"},
            },
            "required": ["id", "name", "ok"],
        },
    }
)
WARMUP_STEPS = 8


def make_scheduler(spec: bool, max_batch: int, device: str):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    extra = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_policy="always") if spec else {}
    return Scheduler(
        ServerArgs(device=device, max_running_requests=max(max_batch, 8), cuda_graph_max_bs=max(max_batch, 8), **extra)
    )


def measure(scheduler, batch: int, constrained: bool, steps: int, device: str) -> dict:
    """Admits `batch` requests, times `steps` decode steps, then aborts them and lets the
    scheduler go idle (its radix cache is flushed, so the next measurement starts alike)."""
    from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    spec = scheduler.spec is not None
    new_tokens = (WARMUP_STEPS + steps) * (4 if spec else 1) + 16
    rids = [f"{'c' if constrained else 'u'}{batch}-{i}" for i in range(batch)]
    for i, rid in enumerate(rids):
        params = SamplingParams(
            max_new_tokens=new_tokens, temperature=0, ignore_eos=True, json_schema=SCHEMA if constrained else None
        )
        prompt = [10 + (7 * i + j) % 2000 for j in range(32)]
        scheduler.add_request(TokenizedGenerateReqInput(rid, prompt, params, stream=False))
    while len(scheduler.running_reqs) < batch:  # compiles and prefills
        scheduler.step()
    for _ in range(WARMUP_STEPS):
        scheduler.step()
    _sync(device)
    tokens_before, start = scheduler.num_generated_tokens, time.perf_counter()
    for _ in range(steps):
        scheduler.step()
    _sync(device)
    seconds = time.perf_counter() - start
    tokens = scheduler.num_generated_tokens - tokens_before
    assert len(scheduler.running_reqs) == batch, "a request finished while the steps were timed"
    for rid in rids:
        scheduler.abort_request(AbortReq(rid))
    while scheduler.has_work():
        scheduler.step()
    scheduler.flush_cache()
    return {
        "batch": batch,
        "mode": "spec_k3" if spec else "plain",
        "constrained": constrained,
        "step_ms": 1000 * seconds / steps,
        "tokens_per_step": tokens / steps / batch,
        "tokens_per_s": tokens / seconds,
        "device": device,
    }


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "constrained_step_cost.json"))
    parser.add_argument("--batch", default="1,64")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batches = [int(b) for b in args.batch.split(",")]
    rows = []
    for spec in (False, True):  # one scheduler per mode, its graphs captured once
        scheduler = make_scheduler(spec, max(batches), device)
        for batch in batches:
            pair = [measure(scheduler, batch, constrained, args.steps, device) for constrained in (False, True)]
            pair[1]["constrained_over_unconstrained"] = pair[1]["step_ms"] / pair[0]["step_ms"]
            rows.extend(pair)
            for row in pair:
                print(json.dumps(row), flush=True)
        del scheduler
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
