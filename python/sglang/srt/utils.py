"""Small helpers shared by several processes."""

from __future__ import annotations

import json
import logging
import os
import time


def eos_token_ids(model_path: str, tokenizer_path: str) -> set[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer config, merged."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        ids |= _as_ids(_read_json(os.path.join(model_path, name)).get("eos_token_id"))
    tok_cfg = _read_json(os.path.join(tokenizer_path, "tokenizer_config.json"))
    eos_token = tok_cfg.get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    if eos_token:
        ids |= _token_id(tokenizer_path, eos_token)
    return ids


def _token_id(tokenizer_path: str, token: str) -> set[int]:
    path = os.path.join(tokenizer_path, "tokenizer.json")
    if not os.path.isfile(path):
        return set()
    from tokenizers import Tokenizer

    token_id = Tokenizer.from_file(path).token_to_id(token)
    return set() if token_id is None else {token_id}


def read_json_object(path: str) -> dict:
    """A file that must hold a JSON object (a config.json); a ValueError naming the file otherwise."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(raw).__name__}")
    return raw


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _as_ids(value) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def name_process(name: str) -> None:
    """Show this process as `name` (at most 15 characters) in top, ps -o comm and /proc/PID/comm,
    so the server's processes can be told apart (and monitored) by name. Linux only; elsewhere,
    or where /proc is read-only, nothing happens."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def check_port_free(host: str, port: int) -> None:
    """Raises RuntimeError when (host, port) cannot be listened on, e.g. another server holds it."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise RuntimeError(
                f"cannot listen on {host}:{port} ({e.strerror}); is another server running "
                f"there? Pick a free port with --port"
            ) from None


def configure_logger(log_level: str, prefix: str = "") -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format=f"[%(asctime)s{prefix}] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )


_IS_CUDA: dict = {}


def is_cuda_device(device) -> bool:
    """Whether `device` (a string or torch.device) is a CUDA device; remembered per value, since
    building a torch.device costs the host a few microseconds each time and a step asks often."""
    known = _IS_CUDA.get(device)
    if known is None:
        import torch

        known = _IS_CUDA[device] = torch.device(device).type == "cuda"
    return known


def host_tensor(values: list, device, dtype=None):
    """A host tensor of `values` (int64 unless `dtype`), in pinned memory when it is bound for a
    CUDA `device`, so that copying it there is truly asynchronous instead of a hidden sync."""
    import torch

    tensor = torch.tensor(values, dtype=dtype or torch.int64)
    return tensor.pin_memory() if is_cuda_device(device) else tensor


def host_to_device(values: list, device, dtype=None):
    """A tensor of `values` (int64 unless `dtype`) on `device`, copied from pinned memory."""
    return host_tensor(values, device, dtype).to(device, non_blocking=True)


def host_to_device_rows(rows: list[list], device, dtype=None) -> list:
    """Several lists sent to `device` in one copy (each copy costs the host tens of microseconds
    on CUDA, which a step of a small model cannot hide): one contiguous 1-D tensor per list,
    views of one buffer, in the order given.

    Each view starts on a 16-byte boundary (rows are padded to it). Triton specializes a kernel
    on whether each pointer argument is 16-byte aligned, so views at offsets that follow the
    batch's row lengths would flip that from one batch to the next, and each new combination
    compiles the kernel again in the middle of serving (0.3-1 s with every request waiting)."""
    import torch

    per_16_bytes = max(1, 16 // (dtype or torch.int64).itemsize)
    flat, starts = [], []
    for row in rows:
        starts.append(len(flat))
        flat.extend(row)
        flat.extend([0] * (-len(row) % per_16_bytes))
    flat_d = host_to_device(flat, device, dtype)
    return [flat_d[start : start + len(row)] for start, row in zip(starts, rows)]


_STREAMS: dict = {}


def step_stream(device):
    """The CUDA stream steps run on (the device's current stream when first asked), kept: torch's
    own `current_stream()` costs ~9 us of Python a call on the H200 machine (host_ops_gpu.py),
    and an event recorded without a stream asks for it. Steps never change streams; a graph
    capture does, but records no events through this. Kept by the device as given (a string or
    torch.device): building a torch.device to normalize it would cost a few us a call too."""
    stream = _STREAMS.get(device)
    if stream is None:
        import torch

        stream = _STREAMS[device] = torch.cuda.current_stream(device)
    return stream


class HostStaging:
    """Host-to-device copies of a step's small inputs through a few reused host buffers (pinned
    on CUDA), one copy per step whatever it carries: filling a numpy view of a buffer costs a
    microsecond or two, where each `host_to_device` of a list costs ~30 us of torch calls on the
    H200 machine. A buffer is handed out again only once the copy that read it has run (an
    event recorded after it), so an overlapped step can fill the next one while the device
    still works through the last."""

    def __init__(self, numel: int, device, depth: int = 4, dtype=None, device_buffers: bool = False):
        """`device_buffers`: each host buffer gets a device buffer of its own, which `send()`
        without a target fills and returns (reused, like its host buffer, `depth` sends later;
        that copy runs after every step that read the buffer, as they are on the same stream)."""
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        dtype = dtype or torch.int64
        self.buffers = [torch.zeros(numel, dtype=dtype, pin_memory=self.cuda) for _ in range(depth)]
        self.arrays = [buffer.numpy() for buffer in self.buffers]
        self.targets = (
            [torch.zeros(numel, dtype=dtype, device=self.device) for _ in range(depth)] if device_buffers else None
        )
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(depth)]
        self.used = [False] * depth
        self.next = 0

    def fill(self):
        """The next buffer, as a numpy array to write the inputs into (its old contents stay)."""
        i = self.next
        if self.cuda and self.used[i]:
            self.events[i].synchronize()  # normally long done: it has depth - 1 copies after it
        return self.arrays[i]

    def send(self, target=None):
        """Copies the buffer `fill` gave, whole, into `target` (a device tensor of its size and
        dtype; None: this buffer's own device buffer), without waiting, and returns the target.
        Whole: slicing a tensor costs more host time than the bytes."""
        i = self.next
        target = self.targets[i] if target is None else target
        target.copy_(self.buffers[i], non_blocking=True)
        if self.cuda:
            self.events[i].record(step_stream(self.device))
            self.used[i] = True
        self.next = (i + 1) % len(self.buffers)
        return target


# Each timing is the fastest of this many timed batches: other servers starting on the device slow
# some batches (four 8B servers started together read batch 256's plain step as 21.5 ms).
TIMING_TRIALS = 3


def fastest_call(device: str, call, repeats: int, trials: int = TIMING_TRIALS) -> float:
    """Seconds per call of `call`, from the fastest of `trials` timed batches of `repeats` calls."""
    import torch

    best = float("inf")
    for _ in range(trials):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


class PhaseTimer:
    """Wall time of the phases of one step (CUDA events on the GPU, read when the step is done)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self):
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record(step_stream("cuda"))
            return event
        return time.perf_counter()

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def seconds(self) -> dict[str, float]:
        """Phase -> seconds; on the GPU only once the step has finished."""
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) / 1e3 if self.cuda else b - a
        return out


def is_port_available(port: int) -> bool:
    """Whether a TCP port can be bound on every interface now (upstream's name; the router's
    launcher picks its replicas' ports with it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the OS picks it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
