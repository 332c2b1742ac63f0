"""Shared fixtures: tiny model directories (one per architecture), engines started once per
session and shared by tests, and the KV accounting check after every test."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when a kernel module is imported, whichever test imports one first.
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One torch thread per process unless OMP_NUM_THREADS says otherwise: here (in-process schedulers)
# and in every process the tests start (engines' schedulers, servers, benchmark scripts), which
# inherit the variable. The models are tiny, and on a machine of a few shared cores OpenMP
# threads that spin while they wait for a core make a test many times slower (measured: a
# speculative scheduler's 252 decode steps took 8.5 s with one thread, 183-219 s with two, on a
# loaded 2-core machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory_for_reuse() -> None:
    """glibc gives a freed block over 128 KB (a batch's logits and sampling noise, [requests,
    vocab]) back to the kernel at once, and the next step's block faults its pages in again. Here,
    and in every process the tests start (they inherit the variables), blocks up to 32 MB come from
    the heap and up to 256 MB of free heap is kept (measured: a sampling test of 1,200 requests in
    an in-process scheduler, 960,000 -> 260,000 page faults, 3.9 -> 1.8 CPU-s of system time)."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if hasattr(libc, "mallopt"):  # glibc; the variables are read at a process's start only
        libc.mallopt(M_MMAP_THRESHOLD, int(os.environ["MALLOC_MMAP_THRESHOLD_"]))
        libc.mallopt(M_TRIM_THRESHOLD, int(os.environ["MALLOC_TRIM_THRESHOLD_"]))


keep_freed_memory_for_reuse()

from sglang.test.tiny_models import ARCHITECTURES, make_tiny_model  # noqa: E402 (after the thread settings above)
from sglang.test.server_fixture import assert_engine_kv_accounting  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model(str(root / arch), arch) for arch in ARCHITECTURES}


class EnginePool:
    """Engines keyed by their arguments, started on first use and shut down at the end."""

    def __init__(self, paths: dict[str, str]):
        self.paths = paths
        self.engines = {}

    def get(self, arch: str = "llama", **kwargs):
        import sglang

        key = (arch, tuple(sorted(kwargs.items())))
        if key not in self.engines:
            args = dict(model_path=self.paths[arch], dtype="float32", device="cpu", log_level="warning")
            self.engines[key] = sglang.Engine(**{**args, **kwargs})
        return self.engines[key]

    def shutdown(self):
        for engine in self.engines.values():
            engine.shutdown()


@pytest.fixture(scope="session")
def engine_pool(tiny_model_paths):
    pool = EnginePool(tiny_model_paths)
    yield pool
    pool.shutdown()


assert_kv_accounting = assert_engine_kv_accounting  # DESIGN.md section 4, after every engine test


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the engine: about 560,000 objects) lives as
    long as the test process: frozen out of the garbage collector's passes, as a server's
    start-up objects are (srt/gc_pauses.py), a full collection walks only what tests made since
    (0.3-0.5 s a collection before, and one runs after every test of a Scheduler module)."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def unfrozen_collector():
    """For tests of code that freezes and unfreezes the collector itself: they start with nothing
    frozen, and what lives afterwards is frozen again."""
    gc.unfreeze()
    yield
    gc.freeze()


@pytest.fixture(autouse=True)
def release_in_process_schedulers(request):
    """In-process Schedulers hold their models and KV pools until the garbage collector breaks the
    reference cycles around them (tests patch methods with closures over the scheduler); a
    collection after each test of a module that builds them keeps the suite's memory flat. What
    survives it (the module's fixtures and caches) is frozen, so that the next test's collection
    walks only what that test made (each walked the module's and its imports' objects again:
    0.15 s a test, 6.8 of test_scheduler.py's 28 CPU-s)."""
    yield
    if "Scheduler" in vars(request.module):
        gc.collect()
        gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def release_module_fixtures_frozen_in_between(request):
    """Torn down after the module's own fixtures: what they held in reference cycles was frozen
    after each test, out of any collection's reach; one full collection gives it back."""
    yield
    if "Scheduler" in vars(request.module):
        gc.unfreeze()
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def kv_accounting_holds_after_test(request):
    yield
    if "engine_pool" in request.fixturenames:
        for engine in request.getfixturevalue("engine_pool").engines.values():
            assert_kv_accounting(engine)


class HFReference:
    """transformers models of the tiny directories, for token-exact comparisons."""

    def __init__(self, paths):
        self.paths = paths
        self.models = {}

    def model(self, arch: str):
        from transformers import AutoModelForCausalLM

        if arch not in self.models:
            self.models[arch] = AutoModelForCausalLM.from_pretrained(self.paths[arch], dtype=torch.float32).eval()
        return self.models[arch]

    @torch.no_grad()
    def greedy(self, arch: str, input_ids: list[int], max_new_tokens: int) -> list[int]:
        out = self.model(arch).generate(
            torch.tensor([input_ids]),
            attention_mask=torch.ones(1, len(input_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        return out[0, len(input_ids) :].tolist()

    @torch.no_grad()
    def next_token_logits(self, arch: str, input_ids: list[int]) -> torch.Tensor:
        return self.model(arch)(torch.tensor([input_ids])).logits[0, -1].float()

    @torch.no_grad()
    def prompt_logprobs(self, arch: str, input_ids: list[int]) -> torch.Tensor:
        """[len, vocab] float64: row i is the log-softmax of the logits after input_ids[: i + 1]."""
        return torch.log_softmax(self.model(arch)(torch.tensor([input_ids])).logits[0].double(), dim=-1)


@pytest.fixture(scope="session")
def hf_reference(tiny_model_paths):
    return HFReference(tiny_model_paths)


# The modules that take longest (a minute or more of a 2-core machine each, slowest first by a full
# run's durations), run first: with the suite spread over processes (`-n`, pytest-xdist, one module
# per process at a time), a long module picked up last would leave the other processes idle at the end.
SLOW_FIRST = (
    "speculative/test_spec_switch.py",
    "test_spec_envelope_script.py",
    "speculative/test_spec_without_draft.py",
    "speculative/test_eagle_worker.py",
    "kernels/test_fused_moe_kernel.py",
    "distributed/test_tensor_parallel.py",
    "entrypoints/test_replicas.py",
    "entrypoints/test_tool_calls_server.py",
    "entrypoints/test_http_server.py",
    "model_executor/test_graph_runner_logic.py",
    "speculative/test_spec_grammar.py",
    "test_host_calls.py",
    "entrypoints/openai/test_reasoning.py",
    "speculative/test_spec_server.py",
    "test_bench_serving.py",
    "entrypoints/test_structured_outputs.py",
    "model_executor/test_prefill_graphs.py",
    "entrypoints/test_bad_requests.py",
    "test_bench_speculative.py",
    "speculative/test_published_drafts.py",
)


def pytest_configure(config):
    """pytest-xdist hands out modules (`--dist loadfile`) by their number of tests, most first,
    unless told otherwise: the order below would be lost (a 5-test module of 5 minutes, started
    last, ran alone while the other processes sat idle)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, name in enumerate(SLOW_FIRST) if path.endswith(name)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: every other module keeps its order
