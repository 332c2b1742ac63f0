"""Test servers forked from one process that has already imported the server's libraries.

Each `python -m sglang.launch_server` of a test spends about 5 of its 8 CPU-seconds importing torch,
transformers, FastAPI and pydantic. `python -m sglang.test.server_zygote` imports them once, then
reads one JSON request per line on stdin and answers one JSON line on stdout:

- `{"op": "spawn", "module", "args", "env", "cwd", "log"}`: forks a child that starts a session of
  its own, takes the log file as stdout and stderr, the request's environment and directory, and
  runs `python -m module args` in it; answers `{"pid"}`;
- `{"op": "poll", "pid"}`: answers `{"returncode"}`, None while the child runs, as `Popen` gives it.

Only third-party libraries are imported beforehand, never sglang's own modules, so what a server
reads from its environment at import it reads from the request's. The zygote ends at EOF on stdin.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import tempfile

# The libraries a server imports that cost the most.
PRELOAD = ("torch", "transformers", "fastapi", "uvicorn", "pydantic", "safetensors", "numpy")
# The variables these libraries (or the C libraries under them) may read when they load: a server whose
# environment differs from the zygote's in one of them starts the usual way (ServerProcess). Every other
# variable a server reads, it reads from the request's environment. OMP_NUM_THREADS is applied in the
# child (torch.set_num_threads).
IMPORT_TIME_ENV_PREFIXES = (
    "PYTORCH_", "TORCH_", "CUDA", "NCCL_", "TRANSFORMERS_", "HF_", "TOKENIZERS_",
    "MKL_", "KMP_", "GOMP_", "OMP_", "PYTHON", "LD_", "MALLOC_",
)  # fmt: skip


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """What of `env` the zygote's imports may have read."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV_PREFIXES) and k != "OMP_NUM_THREADS"}


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import transformers.utils.type_validators  # noqa: F401 (every model config imports it)


def serve() -> dict | None:
    """The zygote's loop; returns the spawn request in a forked child, None at EOF in the zygote."""
    done: dict[int, int] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "spawn":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                return request
            answer = {"pid": pid}
        else:
            pid = request["pid"]
            if pid not in done:
                reaped, status = os.waitpid(pid, os.WNOHANG)
                if reaped:
                    done[pid] = os.waitstatus_to_exitcode(status)
            answer = {"returncode": done.get(pid)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return None


def become(request: dict) -> None:
    """In the forked child: what `subprocess.Popen(..., start_new_session=True)` would have given it."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdin = open(os.devnull)  # the zygote's reader may hold requests it read ahead
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # gettempdir() caches TMPDIR as read in the zygote
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["args"]]
    if "OMP_NUM_THREADS" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def main() -> None:
    preload()
    # What the imports made stays out of every child's collections: a collection writes to each
    # object it walks, and so would copy the zygote's pages into each child.
    gc.freeze()
    sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    sys.stdout.flush()
    request = serve()
    if request is None:
        return
    become(request)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
