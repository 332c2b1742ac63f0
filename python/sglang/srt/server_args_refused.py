"""Upstream SGLang launch_server flags that need a word here: those refused by name, each with what to
use instead; those accepted because they ask for what is already the behaviour; and the short
errors of the launch_server parser (no 50-line usage dump)."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

NO_LORA = "LoRA adapters are not served; merge the adapter into the weights and serve the merged checkpoint"
NO_PD = "prefill-decode disaggregation is not supported; run whole servers (--dp-size N behind sglang-router)"
NO_MULTI_NODE = "servers span one host; run one server per node behind sglang-router"
NO_EP = "expert parallelism is not supported (no mixture-of-experts model is served)"
NO_QUANT = (
    "not served yet: FP8 checkpoints (block-wise fp8, compressed-tensors, ModelOpt) load from --model-path as "
    "their config.json says, and --quantization fp8 quantizes an unquantized checkpoint at load"
)
NO_MM = "multimodal models are not served; this engine serves text models"
NO_HUB = "nothing is downloaded; pass a local model directory to --model-path"
CUDA_GRAPHS = (
    "this engine captures CUDA graphs of decode and prefill steps instead (on by default; "
    "--cuda-graph-max-bs, --prefill-cuda-graph-max-tokens)"
)

# Flag -> why it is refused and what to use instead.
REFUSED_FLAGS = {
    # kernels and backends
    "--enable-torch-compile": CUDA_GRAPHS,
    "--torch-compile-max-bs": CUDA_GRAPHS,
    "--sampling-backend": "sampling runs on this engine's own kernels; there is no backend to choose",
    "--enable-mixed-chunk": (
        "prefill and decode run as separate steps; --chunked-prefill-size and "
        "--admission-batch-steps shape the prefill passes"
    ),
    "--prefill-attention-backend": "use --attention-backend triton (CUDA) or torch_native for every step",
    "--decode-attention-backend": "use --attention-backend triton (CUDA) or torch_native for every step",
    "--mm-attention-backend": NO_MM,
    # quantization
    "--quantization-param-path": NO_QUANT,
    "--modelopt-quant": NO_QUANT,
    # model loading
    "--revision": NO_HUB,
    "--skip-tokenizer-init": "the server always loads the tokenizer; send input_ids to skip tokenization per request",
    "--is-embedding": "embedding models are not served; this engine serves generation only",
    "--enable-multimodal": NO_MM,
    "--json-model-override-args": "edit the model directory's config.json instead",
    # LoRA
    "--enable-lora": NO_LORA,
    "--lora-paths": NO_LORA,
    "--max-loras-per-batch": NO_LORA,
    "--lora-backend": NO_LORA,
    "--max-lora-rank": NO_LORA,
    "--lora-target-modules": NO_LORA,
    # parallelism
    "--pp-size": "pipeline parallelism is not supported; use --tp-size within a host and --dp-size for replicas",
    "--pipeline-parallel-size": "pipeline parallelism is not supported; use --tp-size within a host and --dp-size "
    "for replicas",
    "--ep-size": NO_EP,
    "--expert-parallel-size": NO_EP,
    "--enable-dp-attention": "use --dp-size N: whole replicas behind sglang-router",
    "--nnodes": NO_MULTI_NODE,
    "--node-rank": NO_MULTI_NODE,
    "--dist-init-addr": NO_MULTI_NODE,
    # disaggregation
    "--disaggregation-mode": NO_PD,
    "--disaggregation-transfer-backend": NO_PD,
    "--disaggregation-bootstrap-port": NO_PD,
    # caches
    "--enable-hierarchical-cache": "the KV cache lives in device memory only; size it with --mem-fraction-static",
    "--enable-lmcache": "the KV cache lives in device memory only; size it with --mem-fraction-static",
    # runtime
    "--enable-deterministic-inference": (
        "greedy requests and seeded sampled requests (sampling_seed) are already reproducible; see docs/http_api.md"
    ),
    "--config": "give the flags on the command line",
    # scheduling
    "--page-size": "the KV cache is allocated per token; there is no page size to set",
    "--schedule-conservativeness": "admission keeps a decode reserve of its own; size the pool with "
    "--max-total-tokens or --mem-fraction-static",
    "--enable-priority-scheduling": "requests run in --schedule-policy order (fcfs or lpm); there are no priorities",
    "--load-balance-method": "with --dp-size, sglang-router balances the replicas: use --router-policy",
    "--tokenizer-worker-num": "one tokenizer process serves; long prompts are tokenized on worker threads",
    "--stream-output": "streams send the text so far in each chunk; use --stream-interval to send fewer chunks",
    "--enable-two-batch-overlap": "use the default overlap schedule (--disable-overlap-schedule turns it off)",
    "--disable-cuda-graph-padding": "batches are padded to the captured sizes; use --disable-cuda-graph or "
    "--cuda-graph-bs",
    "--triton-attention-num-kv-splits": "the triton decode kernel's split count is fixed",
    # logging
    "--log-level-http": "one --log-level sets every process's logging",
    "--show-time-cost": "SGLANG_STEP_TIMES=PREFIX writes each scheduler phase's time (docs/server_args.md)",
    "--decode-log-interval": "the decode log line comes every 40 decode steps",
    # API
    "--completion-template": "/v1/completions takes the prompt as given",
    "--preferred-sampling-params": "use --sampling-defaults model (the model's generation_config.json) or "
    "send the parameters per request",
}

# Upstream flags that ask for what this engine already does: accepted, and nothing changes.
ALREADY_THE_BEHAVIOUR = {
    "--enable-cache-report": "every response's usage reports cached prompt tokens "
    "(prompt_tokens_details.cached_tokens; meta_info.cached_tokens on /generate)",
    "--disable-custom-all-reduce": "tensor parallelism all-reduces through torch.distributed (NCCL, gloo); there is "
    "no custom all-reduce",
    "--enable-p2p-check": "NCCL checks peer access between GPUs itself",
}

# Values of supported flags that upstream accepts and this engine does not.
ATTENTION_BACKEND_ALTERNATIVE = "use triton (CUDA; the default there) or torch_native"


class LaunchArgumentParser(argparse.ArgumentParser):
    """argparse with launch_server's errors: one line naming the flag (a refused upstream flag
    says why and what to use; an unknown one gets the nearest known flag), then a pointer to
    --help, instead of the whole usage text."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        refuse_upstream_flags(self, args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog} --help lists the flags\n")

    def unknown_flags(self, unknown: list[str]) -> NoReturn:
        """The error for what parse_known_args left: the first unknown flag, with the nearest known one."""
        flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
        if not flags:
            self.error(f"unexpected argument {unknown[0]!r} (every value follows its flag)")
        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        close = difflib.get_close_matches(flags[0], known, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.error(f"unknown flag {flags[0]}{hint}")


def add_already_the_behaviour_flags(parser) -> None:
    """Upstream flags that change nothing here; --help says why (they are no ServerArgs fields)."""
    group = parser.add_argument_group("upstream flags accepted: already the behaviour here")
    for flag, why in ALREADY_THE_BEHAVIOUR.items():
        group.add_argument(flag, action="store_true", help=f"Accepted; changes nothing: {why}.")


def refuse_upstream_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    for arg in argv:
        if arg == "--":
            return
        flag = arg.split("=", 1)[0]
        if flag in REFUSED_FLAGS:
            parser.error(f"{flag} (an upstream SGLang flag) is not supported: {REFUSED_FLAGS[flag]}")
