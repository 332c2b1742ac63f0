"""What the host pays for each small operation a decode step makes, on this machine's CUDA device:
pinned allocations, host-to-device and device-to-host copies, CUDA events, graph replays, and
the host-side tensor ops of processing a step. The scheduler of a small model is host-bound
(issue 8: 1.2-5 ms of host time per step against 0.5-0.9 ms of device time on the demo pair),
so this prices each candidate for removal before any of it is changed.

    python benchmark/host_ops_gpu.py --out host_ops.json [--calls 2000]

Each operation runs `--calls` times in a row, in 5 rounds; the median round's microseconds per
call are reported (the device is synchronized between rounds, not between calls). Graph replays
are timed one at a time with the device idle before each (`launch_us`).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time

import torch


def per_call_us(fn, calls: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def launch_us(fn, calls: int) -> float:
    """The median host time of one call, the device idle before each: what launching costs
    when the device keeps up (a long graph would otherwise fill the launch queue and time the
    device instead)."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def small_graph(num_kernels: int, bs: int = 4):
    x = torch.zeros(bs, 256, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            for _ in range(num_kernels):
                x.add_(1.0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(num_kernels):
            x.add_(1.0)
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    n = args.calls
    dev = torch.zeros(16, dtype=torch.int64, device="cuda")
    pinned = torch.zeros(16, dtype=torch.int64).pin_memory()
    pageable = torch.zeros(16, dtype=torch.int64)
    stream = torch.cuda.current_stream()
    done = torch.cuda.Event()
    done.record()
    timed = torch.cuda.Event(enable_timing=True)
    rows4 = [3, 9, 27, 81]
    rows256 = list(range(256))
    head = torch.arange(1, 1 << 20, dtype=torch.int64)
    num_out = torch.tensor([1, 4, 2, 3], dtype=torch.int64)
    slots = torch.arange(16, dtype=torch.int64)
    graphs = {k: small_graph(k) for k in (1, 50, 400)}
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": n, "us_per_call": {}}
    ops = {
        "torch.tensor(4 ints)": lambda: torch.tensor(rows4, dtype=torch.int64),
        "torch.tensor(256 ints)": lambda: torch.tensor(rows256, dtype=torch.int64),
        "tensor(4).pin_memory()": lambda: torch.tensor(rows4, dtype=torch.int64).pin_memory(),
        "host_to_device(4): tensor, pin, .to": lambda: torch.tensor(rows4, dtype=torch.int64).pin_memory().to(
            "cuda", non_blocking=True),
        "tensor(4).to(cuda) from pageable": lambda: torch.tensor(rows4, dtype=torch.int64).to("cuda", non_blocking=True),
        "torch.empty(16, pin_memory=True)": lambda: torch.empty(16, dtype=torch.int64, pin_memory=True),
        "pinned.copy_(dev, non_blocking)": lambda: pinned.copy_(dev, non_blocking=True),
        "dev.copy_(pinned, non_blocking)": lambda: dev.copy_(pinned, non_blocking=True),
        "dev.copy_(pageable, non_blocking)": lambda: dev.copy_(pageable, non_blocking=True),
        "dev[:4].zero_()": lambda: dev[:4].zero_(),
        "torch.cuda.Event()": lambda: torch.cuda.Event(),
        "torch.cuda.Event(enable_timing=True)": lambda: torch.cuda.Event(enable_timing=True),
        "event.record()": lambda: timed.record(),
        "event.record(stream)": lambda: timed.record(stream),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "done.synchronize() (complete)": lambda: done.synchronize(),
        "done.query() (complete)": lambda: done.query(),
        "graph replay, 1 kernel": lambda: graphs[1].replay(),
        "graph replay, 50 kernels": lambda: graphs[50].replay(),
        "graph replay, 400 kernels": lambda: graphs[400].replay(),
        "pinned[:16].tolist()": lambda: pinned.tolist(),
        "host: arange(4) >= num_out[:, None]": lambda: torch.arange(4) >= num_out.reshape(-1, 1),
        "host: slots.view(4,4)[mask]": lambda: slots.view(4, 4)[torch.arange(4) >= num_out.reshape(-1, 1)],
        "host: head[:16] slice": lambda: head[:16],
        "host: t.to('cpu', copy=True)": lambda: slots.to("cpu", torch.int64, copy=True),
        "pickle 4-request output": lambda: pickle.dumps({"rids": [f"r{i}" for i in range(4)],
                                                          "ids": [[1, 2, 3]] * 4, "done": [None] * 4}),
    }
    for name, fn in ops.items():
        fn()
        us = launch_us(fn, max(50, n // 10)) if name.startswith("graph") else per_call_us(fn, n)
        out["us_per_call"][name] = round(us, 2)
        print(f"{name:44} {out['us_per_call'][name]:8.2f} us", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
