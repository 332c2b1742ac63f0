"""ServerArgs: every user-facing setting, with upstream SGLang's flag names.

Validated once at start-up (`ServerArgs.check`) and read-only afterwards; settings derived
from them (pool sizes, the resolved dtype) live in their own objects, never written back here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import types
from typing import Optional

from sglang.srt.cli_help import DefaultsHelpFormatter, HelpGroups

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMAT_CHOICES = ("auto", "safetensors", "pt", "dummy")
DEVICE_CHOICES = ("cuda", "cpu")
SCHEDULE_POLICY_CHOICES = ("fcfs", "lpm")
ATTENTION_BACKEND_CHOICES = ("triton", "torch_native")
LOG_LEVEL_CHOICES = ("debug", "info", "warning", "error", "critical")
SAMPLING_DEFAULTS_CHOICES = ("model", "openai")


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
    dtype: str = "auto"
    load_format: str = "auto"
    device: Optional[str] = None
    context_length: Optional[int] = None
    mem_fraction_static: float = 0.85
    max_total_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    chunked_prefill_size: int = 8192
    admission_batch_steps: int = 4
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    random_seed: int = 42
    attention_backend: Optional[str] = None
    log_level: str = "info"
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
    # The per-step mode switch (docs/speculative_decoding.md, "Dynamic speculation").
    speculative_adaptive: bool = False
    speculative_adaptive_config: Optional[str] = None
    speculative_policy: Optional[str] = None
    speculative_threshold: Optional[int] = None
    speculative_candidate_steps: Optional[list[int]] = None
    speculative_draft_sync: Optional[str] = None
    # Structured outputs and tool calling (docs/http_api.md).
    grammar_backend: str = "xgrammar"
    tool_call_parser: Optional[str] = None
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
            object.__setattr__(self, "max_sequences_per_request",
                               DEFAULT_MAX_SEQUENCES_PER_REQUEST.get(self.device, DEFAULT_MAX_SEQUENCES_PER_REQUEST["cpu"]))
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
                raise ValueError("--speculative-algorithm needs --speculative-draft-model-path (an EAGLE-3 "
                                 "draft checkpoint for the target model)")
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
    def prefill_pass_tokens(self) -> int:
        """New tokens that fill one prefill pass: the largest prefill graph's, or the chunk size."""
        if self.prefill_cuda_graph_max_tokens > 0:
            return min(self.prefill_cuda_graph_max_tokens, self.chunked_prefill_size)
        return self.chunked_prefill_size

    def check(self) -> None:
        _check_choice("--dtype", self.dtype, DTYPE_CHOICES)
        _check_choice("--load-format", self.load_format, LOAD_FORMAT_CHOICES)
        _check_choice("--device", self.device, DEVICE_CHOICES)
        _check_choice("--schedule-policy", self.schedule_policy, SCHEDULE_POLICY_CHOICES)
        _check_choice("--attention-backend", self.attention_backend, ATTENTION_BACKEND_CHOICES)
        _check_choice("--log-level", self.log_level, LOG_LEVEL_CHOICES)
        _check_choice("--sampling-defaults", self.sampling_defaults, SAMPLING_DEFAULTS_CHOICES)
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}"
            )
        _check_positive("--context-length", self.context_length)
        _check_positive("--max-total-tokens", self.max_total_tokens)
        _check_positive("--max-running-requests", self.max_running_requests)
        _check_positive("--chunked-prefill-size", self.chunked_prefill_size)
        if self.admission_batch_steps < 0:
            raise ValueError(f"--admission-batch-steps must be >= 0 (0 admits every request at once), "
                             f"got {self.admission_batch_steps}")
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
            raise ValueError(f"--prefill-cuda-graph-max-tokens must be >= 0 (0 turns prefill graphs off), "
                             f"got {self.prefill_cuda_graph_max_tokens}")
        if self.attention_backend == "triton" and self.device != "cuda":
            raise ValueError("--attention-backend triton needs --device cuda; use torch_native on the CPU")
        self._check_speculative()
        self._check_structured_outputs()
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be >= 0, got {self.max_queued_requests}")
        for flag, value in (("--max-payload-size", self.max_payload_size),
                            ("--max-sequences-per-request", self.max_sequences_per_request),
                            ("--max-stop-strings", self.max_stop_strings),
                            ("--max-stop-str-len", self.max_stop_str_len)):
            _check_positive(flag, value)
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in [1, 65535], got {self.port}")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("--device cuda was asked for, but no CUDA device is available")
            visible = torch.cuda.device_count()
            if self.tp_size > visible:
                raise ValueError(f"--tp-size {self.tp_size} needs {self.tp_size} GPUs, one per rank; "
                                 f"{visible} {'is' if visible == 1 else 'are'} visible")

    def _check_structured_outputs(self) -> None:
        _check_choice("--grammar-backend", self.grammar_backend, GRAMMAR_BACKEND_CHOICES)
        if self.tool_call_parser is not None:
            _check_choice("--tool-call-parser", self.tool_call_parser, TOOL_CALL_PARSER_CHOICES)
        if self.chat_template is not None and not os.path.isfile(self.chat_template):
            raise ValueError(f"--chat-template {self.chat_template!r} is not a file (a Jinja template is expected)")

    def _check_speculative(self) -> None:
        if self.speculative_algorithm is None:
            given = [flag for flag, value in (
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
                ("--speculative-draft-sync", self.speculative_draft_sync)) if value is not None]
            if given:
                raise ValueError(f"{given[0]} needs --speculative-algorithm EAGLE3")
            return
        if self.speculative_eagle_topk != 1:
            raise ValueError(f"--speculative-eagle-topk must be 1: only chain drafting is supported "
                             f"(got {self.speculative_eagle_topk})")
        if not 1 <= self.speculative_num_steps <= MAX_SPECULATIVE_STEPS:
            raise ValueError(f"--speculative-num-steps must be in [1, {MAX_SPECULATIVE_STEPS}], "
                             f"got {self.speculative_num_steps}")
        if self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            raise ValueError(
                f"--speculative-num-draft-tokens must be --speculative-num-steps + 1 with chain drafting "
                f"({self.speculative_num_steps + 1}), got {self.speculative_num_draft_tokens}")
        if self.speculative_token_map is not None:
            raise ValueError("--speculative-token-map is not supported: EAGLE-3 checkpoints carry their "
                             "reduced vocabulary as d2t")
        if not os.path.isdir(self.speculative_draft_model_path):
            raise ValueError(f"--speculative-draft-model-path {self.speculative_draft_model_path!r} is not "
                             "a directory")
        self._check_spec_policy()

    def _check_spec_policy(self) -> None:
        from sglang.srt.configs.speculative_adaptive import parse_adaptive_config
        from sglang.srt.speculative.spec_policy import POLICY_NAMES

        _check_choice("--speculative-policy", self.speculative_policy, POLICY_NAMES)
        _check_choice("--speculative-draft-sync", self.speculative_draft_sync, DRAFT_SYNC_CHOICES)
        if self.speculative_policy == "threshold":
            if self.speculative_threshold is None or self.speculative_threshold < 0:
                raise ValueError("--speculative-policy threshold needs --speculative-threshold N >= 0 (speculate "
                                 f"while the decode batch has at most N requests), got {self.speculative_threshold}")
        elif self.speculative_threshold is not None:
            raise ValueError("--speculative-threshold applies to --speculative-policy threshold only "
                             f"(the policy is {self.speculative_policy})")
        k_max = self.speculative_num_steps
        for k in self.speculative_candidate_steps or ():
            if not 0 <= k <= k_max:
                raise ValueError(f"--speculative-candidate-steps: {k} is outside 0..{k_max} "
                                 "(--speculative-num-steps is the largest k)")
        if self.speculative_adaptive_config is not None:
            config = parse_adaptive_config(self.speculative_adaptive_config)
            for bucket, steps in config["candidates_by_bs"].items():
                if max(steps) > k_max:
                    raise ValueError(f"--speculative-adaptive-config {self.speculative_adaptive_config}: batch "
                                     f"size {bucket} lists {max(steps)} steps, more than --speculative-num-steps "
                                     f"({k_max})")

    def speculative_reachable_steps(self) -> list[int]:
        """Every k > 0 the speculation policy can choose: the worker captures graphs for these."""
        k_max = self.speculative_num_steps
        if self.speculative_policy in ("always", "threshold"):
            return [k_max]
        if self.speculative_policy == "never":
            return []
        steps = set(self.speculative_candidate_steps or (0, 1, k_max))
        if self.speculative_adaptive_config is not None:
            from sglang.srt.configs.speculative_adaptive import parse_adaptive_config

            for bucket_steps in parse_adaptive_config(self.speculative_adaptive_config)["candidates_by_bs"].values():
                steps.update(bucket_steps)
        return sorted(k for k in steps if k > 0)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = ServerArgs.__dataclass_fields__
        parser = HelpGroups(parser)  # each flag lands in its --help group (cli_help.HELP_GROUPS)
        parser.add_argument("--model-path", "--model", type=str, default=None,
                            help="Hugging Face model directory (config.json, *.safetensors, tokenizer). "
                                 "Default: the small Python code model shipped in sglang/demo, served "
                                 "as 'sglang-demo-code'.")
        parser.add_argument("--tokenizer-path", type=str, default=None,
                            help="Tokenizer directory; defaults to --model-path.")
        parser.add_argument("--dtype", type=str, default=d["dtype"].default, choices=DTYPE_CHOICES,
                            help="Weight and activation dtype; 'auto' takes the checkpoint's 16-bit dtype "
                                 "(bfloat16 on CUDA and float32 on CPU for a float32 checkpoint).")
        parser.add_argument("--load-format", type=str, default=d["load_format"].default, choices=LOAD_FORMAT_CHOICES,
                            help="How to read the weights: 'auto' takes *.safetensors, else pytorch_model*.bin; "
                                 "'safetensors' / 'pt' only those; 'dummy' reads none and draws random weights "
                                 "(the draft's too), for measuring speed with only config.json and a tokenizer.")
        parser.add_argument("--device", type=str, default=None, choices=DEVICE_CHOICES,
                            help="Device to run on; defaults to cuda when available, else cpu.")
        parser.add_argument("--context-length", type=int, default=None,
                            help="Maximum tokens per request (prompt + output); defaults to the model's "
                                 "max_position_embeddings.")
        parser.add_argument("--mem-fraction-static", type=float, default=d["mem_fraction_static"].default,
                            help="Fraction of GPU memory for weights and the KV cache.")
        parser.add_argument("--max-total-tokens", type=int, default=None,
                            help="Size of the KV pool in tokens. Default: derived from --mem-fraction-static.")
        parser.add_argument("--max-running-requests", type=int, default=None,
                            help="Maximum number of requests decoded together. Default: derived from the KV pool's size.")
        parser.add_argument("--chunked-prefill-size", type=int, default=d["chunked_prefill_size"].default,
                            help="Maximum prompt tokens prefilled in one step; longer prompts are chunked.")
        parser.add_argument("--admission-batch-steps", type=int, default=d["admission_batch_steps"].default,
                            help="While requests decode, prefill passes are shaped to the prefill CUDA graphs: a "
                                 "pass takes no more requests than a graph does (unless eager launches beat the "
                                 "graphs there), and (with 32 or more decoding) a "
                                 "new request may wait up to this many decode steps, and no longer than a pass "
                                 "takes, for others to share its pass (it goes at once when 1/16 of the running "
                                 "number, 16 requests or one pass's tokens wait). 0 admits every request as soon "
                                 "as it can run, as many per pass as --chunked-prefill-size allows.")
        parser.add_argument("--schedule-policy", type=str, default=d["schedule_policy"].default,
                            choices=SCHEDULE_POLICY_CHOICES,
                            help="Order of waiting requests: fcfs or lpm (longest cached prefix first).")
        parser.add_argument("--disable-radix-cache", action="store_true",
                            help="Do not reuse the KV of shared prompt prefixes.")
        parser.add_argument("--random-seed", type=int, default=d["random_seed"].default,
                            help="Seed for requests that do not give sampling_seed.")
        parser.add_argument("--attention-backend", type=str, default=None, choices=ATTENTION_BACKEND_CHOICES,
                            help="Attention kernels: triton (default on CUDA) or torch_native (the reference; "
                                 "default on CPU).")
        parser.add_argument("--log-level", type=str, default=d["log_level"].default, choices=LOG_LEVEL_CHOICES,
                            help="Logging level of every server process.")
        parser.add_argument("--served-model-name", type=str, default=None,
                            help="Model name reported by the API; defaults to --model-path.")
        parser.add_argument("--host", type=str, default=d["host"].default,
                            help="Address the HTTP server listens on (0.0.0.0 for every interface).")
        parser.add_argument("--port", type=int, default=d["port"].default,
                            help="Port the HTTP server listens on; checked free before the model loads.")
        parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=d["tp_size"].default,
                            help="Tensor-parallel ranks: the model (and an EAGLE-3 draft) split Megatron-style over "
                                 "this many processes, one GPU each from --base-gpu-id on (gloo on the CPU). "
                                 "Attention heads and the intermediate size must divide by it; key-value heads "
                                 "must divide by it or divide it (then they are replicated). Under tensor "
                                 "parallelism steps run without CUDA graphs (docs/tensor_parallel.md).")
        parser.add_argument("--dp-size", "--data-parallel-size", type=int, default=d["dp_size"].default,
                            help="Replicas of the whole server behind sglang-router (pip install 'sglang[router]'), "
                                 "each on its own GPU from --base-gpu-id on, or sharing GPUs (and their memory) when "
                                 "there are more replicas than GPUs. --router-* flags configure the router.")
        parser.add_argument("--base-gpu-id", type=int, default=d["base_gpu_id"].default,
                            help="The GPU this server (its first replica) runs on; replica i takes the next ones.")
        parser.add_argument("--sampling-defaults", type=str, default=d["sampling_defaults"].default,
                            choices=SAMPLING_DEFAULTS_CHOICES,
                            help="Where /v1/chat/completions takes the temperature, top_p, top_k and min_p a "
                                 "request leaves unset: model (the model's generation_config.json, where it "
                                 "recommends them; else OpenAI's) or openai (OpenAI's: temperature 1, top_p 1, no "
                                 "top_k or min_p). A request's own values always win; /v1/completions and "
                                 "/generate keep these fixed defaults either way.")
        parser.add_argument("--api-key", type=str, default=None,
                            help="Require 'Authorization: Bearer <key>' on every route but /health* and /metrics. "
                                 "Default: no key.")
        parser.add_argument("--max-queued-requests", type=int, default=None,
                            help="Requests allowed to wait beyond --max-running-requests; more get HTTP 503. "
                                 "Unlimited by default.")
        parser.add_argument("--max-payload-size", type=int, default=d["max_payload_size"].default,
                            help="Largest request body in bytes; a larger one gets HTTP 413 (default 256 MiB, "
                                 "as sglang-router).")
        parser.add_argument("--max-sequences-per-request", type=int, default=d["max_sequences_per_request"].default,
                            help="Most sequences one request may ask for (prompts x n); more get HTTP 400. "
                                 "Default 256 on a GPU, 16 on the CPU (where every sequence in the batch "
                                 "slows every other request's decode steps).")
        parser.add_argument("--max-stop-strings", type=int, default=d["max_stop_strings"].default,
                            help="Most stop strings one request may give; more get HTTP 400.")
        parser.add_argument("--max-stop-str-len", type=int, default=d["max_stop_str_len"].default,
                            help="Longest stop string in characters; a longer one gets HTTP 400.")
        parser.add_argument("--enable-metrics", action="store_true",
                            help="Serve Prometheus metrics at /metrics.")
        parser.add_argument("--skip-server-warmup", action="store_true",
                            help="Report ready without running a warm-up generation first.")
        parser.add_argument("--disable-overlap-schedule", action="store_true",
                            help="Process each decode step's results before launching the next (by default "
                                 "the CPU prepares step N+1 while the device runs step N).")
        parser.add_argument("--disable-cuda-graph", action="store_true",
                            help="Run decode steps eagerly instead of replaying captured CUDA graphs.")
        parser.add_argument("--cuda-graph-max-bs", type=int, default=d["cuda_graph_max_bs"].default,
                            help="Largest decode batch captured in a CUDA graph (buckets 1, 2, 4, 8, then "
                                 "every 8 to 64 and every 16 beyond); larger batches run eagerly.")
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+", default=None,
                            help="Explicit list of batch sizes to capture. Default: the buckets up to --cuda-graph-max-bs.")
        parser.add_argument("--prefill-cuda-graph-max-tokens", type=int,
                            default=d["prefill_cuda_graph_max_tokens"].default,
                            help="Largest prefill (in new tokens, up to 16 requests) replayed from a CUDA graph; "
                                 "each graph is kept only where it beats launching the forward eagerly, "
                                 "measured at start-up. 0 turns prefill graphs off.")
        spec = parser
        spec.add_argument("--speculative-algorithm", type=str, default=None, choices=SPECULATIVE_ALGORITHM_CHOICES,
                          help="EAGLE3 (EAGLE is accepted as the same): a one-layer draft proposes "
                               "--speculative-num-steps tokens per step and the target verifies them at once. "
                               "Off by default.")
        spec.add_argument("--speculative-draft-model-path", "--speculative-draft-model", type=str, default=None,
                          help="EAGLE-3 draft checkpoint (LlamaForCausalLMEagle3). Defaults to the demo draft "
                               "when the target is the demo model.")
        spec.add_argument("--speculative-num-steps", type=int, default=None,
                          help=f"Draft tokens per step, k (default 3; at most {MAX_SPECULATIVE_STEPS}).")
        spec.add_argument("--speculative-eagle-topk", type=int, default=None,
                          help="Draft branching; must be 1 (chain drafting), the default.")
        spec.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                          help="Tokens verified per step; must be k + 1, the default.")
        spec.add_argument("--speculative-token-map", type=str, default=None,
                          help="Not supported (default: none): EAGLE-3 checkpoints carry their reduced vocabulary (d2t).")
        spec.add_argument("--speculative-adaptive", action="store_true",
                          help="Dynamic speculation: each decode step either speculates with one of the "
                               "candidate k or decodes plainly, whichever the policy expects to give more tokens "
                               "per second (default policy: cost).")
        spec.add_argument("--speculative-adaptive-config", type=str, default=None,
                          help="JSON file in upstream's format: batch-size lower bounds (integer keys) to candidate "
                               "steps, e.g. {\"1\": [0, 1, 3], \"64\": [0]}; implies --speculative-adaptive. "
                               "Default: none (candidates from --speculative-candidate-steps).")
        spec.add_argument("--speculative-policy", type=str, default=None,
                          help="How each decode step chooses k: always (k = --speculative-num-steps; the default "
                               "without --speculative-adaptive), never (plain steps, the draft kept warm), threshold "
                               "(speculate while the decode batch has at most --speculative-threshold requests), "
                               "cost (the k with the most expected tokens per second from measured step times and "
                               "observed acceptance; the default with --speculative-adaptive).")
        spec.add_argument("--speculative-threshold", type=int, default=None,
                          help="For --speculative-policy threshold: the largest decode batch that speculates "
                               "(no default: required by that policy).")
        spec.add_argument("--speculative-candidate-steps", type=_int_list, default=None,
                          help="For --speculative-policy cost: the k it chooses from, comma separated, 0 = a plain "
                               "step (default: 0, 1 and --speculative-num-steps).")
        spec.add_argument("--speculative-draft-sync", type=str, default=None, choices=DRAFT_SYNC_CHOICES,
                          help="How the draft follows plain steps: warm (default; each plain step also extends "
                               "the draft by its token, so speculation resumes with no catch-up) or catch-up (plain "
                               "steps run the target only and keep its aux hidden states; the first speculative "
                               "step after them extends the draft over all of them in one forward).")
        spec.add_argument("--disable-speculative-step-graph", action="store_true",
                          help="Replay one graph per forward of a greedy speculative step (draft chain steps, "
                               "verify, draft extend) instead of one graph for the whole step.")

        _add_structured_output_args(parser)

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


# The fields a launcher sets on each replica's copy of the args before starting it: upstream's
# `sglang_router.launch_server` assigns them (port, base_gpu_id = its rank, dp_size = 1).
REPLICA_PLACEMENT_FIELDS = ("port", "base_gpu_id", "dp_size")


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


SPECULATIVE_ALGORITHM_CHOICES = ["EAGLE3", "EAGLE"]
# On the CPU a decode step's time grows with the batch (demo model: ~12 ms at 1 sequence, ~45 ms at
# 16, ~140 ms at 64), so one request's fan-out is kept to what leaves other requests' latency
# within a few times their own.
DEFAULT_MAX_SEQUENCES_PER_REQUEST = {"cuda": 256, "cpu": 16}


GRAMMAR_BACKEND_CHOICES = ("xgrammar", "none")
# Upstream's names; qwen, qwen25 and hermes read the same <tool_call>{...}</tool_call> format.
TOOL_CALL_PARSER_CHOICES = ("llama3", "qwen25", "qwen", "hermes")


def _add_structured_output_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("structured outputs and tool calling")
    group.add_argument("--grammar-backend", type=str, default="xgrammar", choices=GRAMMAR_BACKEND_CHOICES,
                       help="Backend of json_schema / regex / ebnf constraints and response_format: xgrammar, or "
                            "none (constrained requests are refused with 400).")
    group.add_argument("--tool-call-parser", type=str, default=None, choices=TOOL_CALL_PARSER_CHOICES,
                       help="How tool calls are read from the model's output with tool_choice auto: llama3 "
                            "(JSON objects {\"name\", \"parameters\"}) or qwen25 / qwen / hermes "
                            "(<tool_call>{\"name\", \"arguments\"}</tool_call>). Default: none (calls are read only where "
                            "tool_choice is required or names a function).")
    group.add_argument("--chat-template", type=str, default=None,
                       help="Path of a Jinja chat template used for /v1/chat/completions instead of the "
                            "tokenizer's own (or where the tokenizer has none). Default: none (the tokenizer's template).")

DRAFT_SYNC_CHOICES = ("warm", "catch-up")
MAX_SPECULATIVE_STEPS = 16


def _check_choice(flag: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{flag} must be one of {', '.join(choices)}; got {value!r}")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _check_positive(flag: str, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{flag} must be a positive integer, got {value}")


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """Parses and checks the flags; a bad setting exits with one line naming it, before anything loads."""
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server", formatter_class=DefaultsHelpFormatter,
                                     description="Serve a model over HTTP with SGLang's native and "
                                                 "OpenAI-compatible APIs.")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        server_args = ServerArgs.from_cli_args(args)
        check_model_paths(server_args)
        return server_args
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def check_model_paths(server_args: ServerArgs) -> None:
    """The model and tokenizer must be local directories: nothing is downloaded. Checked before
    any process starts, so a typo or a Hugging Face id fails in a line, not after a load."""
    _check_model_dir("--model-path", server_args.model_path, need_config=True)
    from sglang.srt.models.registry import check_architecture

    check_architecture(getattr(_read_config(server_args.model_path), "architectures", None), False,
                       f"--model-path {server_args.model_path}")
    if server_args.speculative_enabled:
        _check_model_dir("--speculative-draft-model-path", server_args.speculative_draft_model_path, need_config=True)
        check_architecture(getattr(_read_config(server_args.speculative_draft_model_path), "architectures", None),
                           True, f"--speculative-draft-model-path {server_args.speculative_draft_model_path}")
    if server_args.tokenizer_path != server_args.model_path:
        _check_model_dir("--tokenizer-path", server_args.tokenizer_path, need_config=False)
    if server_args.tp_size > 1:  # whether --tp-size can split the model(s), before any rank loads them
        from sglang.srt.distributed.parallel_state import check_shardable

        check_shardable(_read_config(server_args.model_path), server_args.tp_size)
        if server_args.speculative_enabled:
            check_shardable(_read_config(server_args.speculative_draft_model_path), server_args.tp_size,
                            "the EAGLE-3 draft")


def _read_config(path: str) -> types.SimpleNamespace:
    """A model directory's config.json as attributes (no model code needed to read head counts)."""
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{config_path} cannot be read as JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, not {type(config).__name__}")
    return types.SimpleNamespace(**config)


def _check_model_dir(flag: str, path: str, need_config: bool) -> None:
    if os.path.isdir(path):
        if need_config and not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{flag} {path!r} has no config.json: point it at a Hugging Face model directory")
        return
    if os.path.exists(path):
        raise ValueError(f"{flag} {path!r} is a file; it must be a model directory")
    if _looks_like_hub_id(path):
        raise ValueError(f"{flag} {path!r} is not a local directory. If it is a Hugging Face model id: weights are "
                         f"not downloaded here, so download them (e.g. `huggingface-cli download {path} --local-dir "
                         f"DIR`) and point {flag} at DIR")
    raise ValueError(f"{flag} {path!r} does not exist")


def _looks_like_hub_id(path: str) -> bool:
    """`org/name` or `name`, as the Hugging Face hub spells model ids."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", path) is not None


@dataclasses.dataclass(frozen=True)
class PortArgs:
    """IPC endpoints between the processes of one server, in a private temp directory."""

    ipc_dir: str
    scheduler_input_ipc: str  # tokenizer manager -> scheduler
    detokenizer_ipc: str  # scheduler -> detokenizer
    tokenizer_ipc: str  # detokenizer and scheduler -> tokenizer manager
    tp_init_address: str = ""  # host:port where the tensor-parallel ranks meet (tp_size > 1)

    @classmethod
    def create(cls, tp_size: int = 1) -> "PortArgs":
        import tempfile

        from sglang.srt.utils import free_port

        ipc_dir = tempfile.mkdtemp(prefix="sglang-ipc-")
        return cls(
            ipc_dir=ipc_dir,
            scheduler_input_ipc=f"ipc://{ipc_dir}/scheduler",
            detokenizer_ipc=f"ipc://{ipc_dir}/detokenizer",
            tokenizer_ipc=f"ipc://{ipc_dir}/tokenizer",
            tp_init_address=f"127.0.0.1:{free_port()}" if tp_size > 1 else "",
        )

