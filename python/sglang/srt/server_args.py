"""ServerArgs: every user-facing setting, with upstream SGLang's flag names.

Validated once at start-up (`ServerArgs.check`) and read-only afterwards; settings derived
from them (pool sizes, the resolved dtype) live in their own objects, never written back here.
The flags themselves are defined in server_args_cli, the model-directory checks in model_paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Optional

from sglang.srt.cli_help import DefaultsHelpFormatter
from sglang.srt.model_paths import check_model_paths
from sglang.srt.port_args import PortArgs  # noqa: F401  (re-exported: upstream's import path)
from sglang.srt.server_args_refused import ATTENTION_BACKEND_ALTERNATIVE, LaunchArgumentParser

# "half" and "float" are upstream's aliases of float16 and float32.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "half", "float")
QUANTIZATION_CHOICES = ("fp8",)  # online; quantized checkpoints say their own (layers/quantization)
# auto: the KV cache takes the model's dtype; FP8 formats with per-layer scales (mem_cache/memory_pool).
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8_e4m3", "fp8_e5m2")
TOKENIZER_MODE_CHOICES = ("auto", "slow")
# --log-requests-level: 0 ids and token counts, 1 also sampling parameters, 2 also the input and
# output text cut to LOG_REQUESTS_TEXT_CHARS, 3 all of it.
LOG_REQUESTS_LEVEL_CHOICES = (0, 1, 2, 3)
LOAD_FORMAT_CHOICES = ("auto", "safetensors", "pt", "dummy")
DEVICE_CHOICES = ("cuda", "cpu")
SCHEDULE_POLICY_CHOICES = ("fcfs", "lpm")
ATTENTION_BACKEND_CHOICES = ("triton", "torch_native")
LOG_LEVEL_CHOICES = ("debug", "info", "warning", "error", "critical")
SAMPLING_DEFAULTS_CHOICES = ("model", "openai")
SPECULATIVE_ALGORITHM_CHOICES = ["EAGLE3", "EAGLE"]
DRAFT_SYNC_CHOICES = ("warm", "catch-up")
MAX_SPECULATIVE_STEPS = 16
GRAMMAR_BACKEND_CHOICES = ("xgrammar", "none")
# Upstream's names; qwen, qwen25 and hermes read the same <tool_call>{...}</tool_call> format.
TOOL_CALL_PARSER_CHOICES = ("llama3", "qwen25", "qwen", "hermes", "mistral")
# Upstream's names (the formats are in srt/reasoning_parser.py).
REASONING_PARSER_CHOICES = ("deepseek-r1", "qwen3")
# On the CPU a decode step's time grows with the batch (demo model: ~12 ms at 1 sequence, ~45 ms at
# 16, ~140 ms at 64), so one request's fan-out is kept to what leaves other requests' latency
# within a few times their own.
DEFAULT_MAX_SEQUENCES_PER_REQUEST = {"cuda": 256, "cpu": 16}
# The fields a launcher sets on each replica's copy of the args before starting it: upstream's
# `sglang_router.launch_server` assigns them (port, base_gpu_id = its rank, dp_size = 1).
REPLICA_PLACEMENT_FIELDS = ("port", "base_gpu_id", "dp_size")


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover - torch is a hard requirement
        return "cpu"


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    model_path: Optional[str] = None  # None: the demo code model shipped in sglang/demo
    tokenizer_path: Optional[str] = None
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: Optional[str] = None  # "fp8": quantize an unquantized checkpoint's linear layers at load
    load_format: str = "auto"
    device: Optional[str] = None
    context_length: Optional[int] = None
    mem_fraction_static: float = 0.85
    max_total_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384  # upstream's default
    admission_batch_steps: int = 4
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    random_seed: int = 42
    attention_backend: Optional[str] = None
    log_level: str = "info"
    log_requests: bool = False
    log_requests_level: int = 2
    gc_warning_threshold_secs: float = 0.0  # log a garbage-collector pause this long or longer (0: none)
    served_model_name: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    # Data parallelism: replicas behind sglang-router (docs/scaling_out.md).
    dp_size: int = 1
    base_gpu_id: int = 0
    replicas_per_gpu: Optional[int] = None  # derived from dp_size and the GPUs: how many share this one
    grpc_mode: bool = False  # read by sglang_router.launch_server; only HTTP is served
    api_key: Optional[str] = None
    max_queued_requests: Optional[int] = None
    # Limits on one request (docs/http_api.md, "Limits").
    max_payload_size: int = 256 * 1024 * 1024  # bytes of a request body (sglang-router's default)
    max_sequences_per_request: Optional[int] = None  # prompts x n; None: by device (see __post_init__)
    max_stop_strings: int = 32
    max_stop_str_len: int = 256  # characters
    enable_metrics: bool = False
    stream_interval: int = 1  # output tokens per streamed chunk (the last chunk may hold fewer)
    watchdog_timeout: float = 300.0  # seconds one scheduler step may take before the server exits
    skip_server_warmup: bool = False
    disable_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    cuda_graph_max_bs: int = 256
    cuda_graph_bs: Optional[tuple[int, ...]] = None
    prefill_cuda_graph_max_tokens: int = 2048
    # Speculative decoding (EAGLE-3, chain drafting).
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_token_map: Optional[str] = None
    disable_speculative_step_graph: bool = False
    # The per-step mode switch (docs/server_args.md, "Speculation policies").
    speculative_adaptive: bool = False
    speculative_adaptive_config: Optional[str] = None
    speculative_policy: Optional[str] = None
    speculative_threshold: Optional[int] = None
    speculative_candidate_steps: Optional[list[int]] = None
    speculative_draft_sync: Optional[str] = None
    # Structured outputs and tool calling (docs/http_api.md).
    grammar_backend: str = "xgrammar"
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None  # chat answers' reasoning blocks go to reasoning_content
    chat_template: Optional[str] = None
    # Where chat requests take the sampling parameters they leave unset (docs/http_api.md).
    sampling_defaults: str = "model"

    def __post_init__(self):
        # Fill the defaults that depend on the machine or on other fields, once.
        if self.model_path is None:
            from sglang import demo

            object.__setattr__(self, "model_path", demo.TARGET_PATH)
            if self.served_model_name is None:
                object.__setattr__(self, "served_model_name", demo.SERVED_MODEL_NAME)
        if self.tokenizer_path is None:
            object.__setattr__(self, "tokenizer_path", self.model_path)
        self._fill_speculative_defaults()
        if self.device is None:
            object.__setattr__(self, "device", _default_device())
        if self.max_sequences_per_request is None:
            object.__setattr__(
                self,
                "max_sequences_per_request",
                DEFAULT_MAX_SEQUENCES_PER_REQUEST.get(self.device, DEFAULT_MAX_SEQUENCES_PER_REQUEST["cpu"]),
            )
        if self.attention_backend is None:
            object.__setattr__(self, "attention_backend", "triton" if self.device == "cuda" else "torch_native")
        if self.cuda_graph_bs is not None:
            object.__setattr__(self, "cuda_graph_bs", tuple(self.cuda_graph_bs))
        if self.served_model_name is None:
            object.__setattr__(self, "served_model_name", self.model_path)
        if self.replicas_per_gpu is None:
            object.__setattr__(self, "replicas_per_gpu", _replicas_per_gpu(self.dp_size * self.tp_size, self.device))
        self.check()

    def _fill_speculative_defaults(self) -> None:
        if self.speculative_algorithm is None:
            return
        _check_choice("--speculative-algorithm", self.speculative_algorithm, SPECULATIVE_ALGORITHM_CHOICES)
        if self.speculative_draft_model_path is None:
            from sglang import demo

            if os.path.abspath(self.model_path) != demo.TARGET_PATH:
                raise ValueError(
                    "--speculative-algorithm needs --speculative-draft-model-path (an EAGLE-3 "
                    "draft checkpoint for the target model)"
                )
            object.__setattr__(self, "speculative_draft_model_path", demo.DRAFT_PATH)
        if self.speculative_eagle_topk is None:
            object.__setattr__(self, "speculative_eagle_topk", 1)
        if self.speculative_num_steps is None:
            steps = (self.speculative_num_draft_tokens - 1) if self.speculative_num_draft_tokens else 3
            object.__setattr__(self, "speculative_num_steps", steps)
        if self.speculative_num_draft_tokens is None:
            object.__setattr__(self, "speculative_num_draft_tokens", self.speculative_num_steps + 1)
        if self.speculative_draft_sync is None:
            object.__setattr__(self, "speculative_draft_sync", "warm")
        if self.speculative_policy is None:
            dynamic = self.speculative_adaptive or self.speculative_adaptive_config is not None
            object.__setattr__(self, "speculative_policy", "cost" if dynamic else "always")

    @property
    def speculative_enabled(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def prefill_token_budget(self) -> int:
        """Prompt tokens one prefill step takes, over all its requests (a longer prompt is chunked)."""
        return min(self.chunked_prefill_size, self.max_prefill_tokens)

    @property
    def prefill_pass_tokens(self) -> int:
        """New tokens that fill one prefill pass: the largest prefill graph's, or the step's budget."""
        if self.prefill_cuda_graph_max_tokens > 0:
            return min(self.prefill_cuda_graph_max_tokens, self.prefill_token_budget)
        return self.prefill_token_budget

    def check(self) -> None:
        _check_choice("--dtype", self.dtype, DTYPE_CHOICES)
        _check_choice("--load-format", self.load_format, LOAD_FORMAT_CHOICES)
        _check_choice("--device", self.device, DEVICE_CHOICES)
        _check_choice("--schedule-policy", self.schedule_policy, SCHEDULE_POLICY_CHOICES)
        if self.attention_backend not in ATTENTION_BACKEND_CHOICES:
            raise ValueError(
                f"--attention-backend {self.attention_backend} is not available here: {ATTENTION_BACKEND_ALTERNATIVE}"
            )
        _check_choice("--log-level", self.log_level, LOG_LEVEL_CHOICES)
        self._check_upstream_extras()
        if not self.gc_warning_threshold_secs >= 0:
            raise ValueError(
                f"--gc-warning-threshold-secs must be >= 0 (0 logs no pause), got {self.gc_warning_threshold_secs}"
            )
        _check_choice("--sampling-defaults", self.sampling_defaults, SAMPLING_DEFAULTS_CHOICES)
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        _check_positive("--context-length", self.context_length)
        _check_positive("--max-total-tokens", self.max_total_tokens)
        _check_positive("--max-running-requests", self.max_running_requests)
        _check_positive("--chunked-prefill-size", self.chunked_prefill_size)
        if self.admission_batch_steps < 0:
            raise ValueError(
                f"--admission-batch-steps must be >= 0 (0 admits every request at once), "
                f"got {self.admission_batch_steps}"
            )
        _check_positive("--tp-size", self.tp_size)
        _check_positive("--dp-size", self.dp_size)
        _check_positive("replicas_per_gpu", self.replicas_per_gpu)
        if self.base_gpu_id < 0:
            raise ValueError(f"--base-gpu-id must be >= 0, got {self.base_gpu_id}")
        if self.grpc_mode:
            raise ValueError("grpc_mode: replicas serve HTTP only; leave gRPC mode off")
        _check_positive("--cuda-graph-max-bs", self.cuda_graph_max_bs)
        for bs in self.cuda_graph_bs or ():
            _check_positive("--cuda-graph-bs", bs)
        if self.prefill_cuda_graph_max_tokens < 0:
            raise ValueError(
                f"--prefill-cuda-graph-max-tokens must be >= 0 (0 turns prefill graphs off), "
                f"got {self.prefill_cuda_graph_max_tokens}"
            )
        if self.attention_backend == "triton" and self.device != "cuda":
            raise ValueError("--attention-backend triton needs --device cuda; use torch_native on the CPU")
        self._check_speculative()
        self._check_structured_outputs()
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be >= 0, got {self.max_queued_requests}")
        for flag, value in (
            ("--max-payload-size", self.max_payload_size),
            ("--max-sequences-per-request", self.max_sequences_per_request),
            ("--max-stop-strings", self.max_stop_strings),
            ("--max-stop-str-len", self.max_stop_str_len),
        ):
            _check_positive(flag, value)
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in [1, 65535], got {self.port}")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("--device cuda was asked for, but no CUDA device is available")
            visible = torch.cuda.device_count()
            if self.tp_size > visible:
                raise ValueError(
                    f"--tp-size {self.tp_size} needs {self.tp_size} GPUs, one per rank; "
                    f"{visible} {'is' if visible == 1 else 'are'} visible"
                )

    def _check_upstream_extras(self) -> None:
        """The upstream flags of the model, logging and streaming that have a meaning here."""
        _check_choice("--tokenizer-mode", self.tokenizer_mode, TOKENIZER_MODE_CHOICES)
        _check_choice("--kv-cache-dtype", self.kv_cache_dtype, KV_CACHE_DTYPE_CHOICES)
        if self.quantization is not None:
            _check_choice("--quantization", self.quantization, QUANTIZATION_CHOICES)
        _check_choice("--log-requests-level", self.log_requests_level, LOG_REQUESTS_LEVEL_CHOICES)
        _check_positive("--max-prefill-tokens", self.max_prefill_tokens)
        _check_positive("--stream-interval", self.stream_interval)
        if not self.watchdog_timeout > 0:
            raise ValueError(f"--watchdog-timeout must be > 0 seconds, got {self.watchdog_timeout}")

    def _check_structured_outputs(self) -> None:
        _check_choice("--grammar-backend", self.grammar_backend, GRAMMAR_BACKEND_CHOICES)
        if self.reasoning_parser is not None:
            _check_choice("--reasoning-parser", self.reasoning_parser, REASONING_PARSER_CHOICES)
        if self.tool_call_parser is not None:
            _check_choice("--tool-call-parser", self.tool_call_parser, TOOL_CALL_PARSER_CHOICES)
        if self.chat_template is not None and not os.path.isfile(self.chat_template):
            raise ValueError(f"--chat-template {self.chat_template!r} is not a file (a Jinja template is expected)")

    def _check_speculative(self) -> None:
        if self.speculative_algorithm is None:
            given = [
                flag
                for flag, value in (
                    ("--speculative-draft-model-path", self.speculative_draft_model_path),
                    ("--speculative-num-steps", self.speculative_num_steps),
                    ("--speculative-eagle-topk", self.speculative_eagle_topk),
                    ("--speculative-num-draft-tokens", self.speculative_num_draft_tokens),
                    ("--speculative-token-map", self.speculative_token_map),
                    ("--speculative-adaptive", self.speculative_adaptive or None),
                    ("--speculative-adaptive-config", self.speculative_adaptive_config),
                    ("--speculative-policy", self.speculative_policy),
                    ("--speculative-threshold", self.speculative_threshold),
                    ("--speculative-candidate-steps", self.speculative_candidate_steps),
                    ("--speculative-draft-sync", self.speculative_draft_sync),
                )
                if value is not None
            ]
            if given:
                raise ValueError(f"{given[0]} needs --speculative-algorithm EAGLE3")
            return
        if self.speculative_eagle_topk != 1:
            raise ValueError(
                f"--speculative-eagle-topk must be 1: only chain drafting is supported "
                f"(got {self.speculative_eagle_topk})"
            )
        if not 1 <= self.speculative_num_steps <= MAX_SPECULATIVE_STEPS:
            raise ValueError(
                f"--speculative-num-steps must be in [1, {MAX_SPECULATIVE_STEPS}], got {self.speculative_num_steps}"
            )
        if self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            raise ValueError(
                f"--speculative-num-draft-tokens must be --speculative-num-steps + 1 with chain drafting "
                f"({self.speculative_num_steps + 1}), got {self.speculative_num_draft_tokens}"
            )
        if self.speculative_token_map is not None:
            raise ValueError(
                "--speculative-token-map is not supported: EAGLE-3 checkpoints carry their reduced vocabulary as d2t"
            )
        if not os.path.isdir(self.speculative_draft_model_path):
            raise ValueError(f"--speculative-draft-model-path {self.speculative_draft_model_path!r} is not a directory")
        self._check_spec_policy()

    def _check_spec_policy(self) -> None:
        from sglang.srt.speculative.spec_policy import check_flags

        _check_choice("--speculative-draft-sync", self.speculative_draft_sync, DRAFT_SYNC_CHOICES)
        check_flags(self)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        # Imported here: server_args_cli reads the choices and defaults from this module.
        from sglang.srt.server_args_cli import add_cli_args

        add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: getattr(args, name) for name in names if hasattr(args, name)})

    @classmethod
    def from_kwargs(cls, **kwargs) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)


def _place_replica(self: ServerArgs, name: str, value) -> None:
    """ServerArgs stays read-only except for a replica's placement, which is checked again."""
    if name not in REPLICA_PLACEMENT_FIELDS:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)
    self.check()


ServerArgs.__setattr__ = _place_replica


def _replicas_per_gpu(num_gpus_asked: int, device: str) -> int:
    """Replicas that share each GPU when the replicas (times their tensor-parallel size) outnumber
    the visible GPUs: each then plans its memory from its share of --mem-fraction-static."""
    if device != "cuda" or num_gpus_asked <= 1:
        return 1
    import torch

    return -(-num_gpus_asked // max(1, torch.cuda.device_count()))


def _check_choice(flag: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{flag} must be one of {', '.join(map(str, choices))}; got {value!r}")


def _check_positive(flag: str, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{flag} must be a positive integer, got {value}")


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """Parses and checks the flags; a bad setting exits with one line naming it, before anything loads."""
    parser = LaunchArgumentParser(
        prog="python -m sglang.launch_server",
        formatter_class=DefaultsHelpFormatter,
        description="Serve a model over HTTP with SGLang's native and OpenAI-compatible APIs.",
    )
    ServerArgs.add_cli_args(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.unknown_flags(unknown)
    try:
        server_args = ServerArgs.from_cli_args(args)
        check_model_paths(server_args)
        return server_args
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
