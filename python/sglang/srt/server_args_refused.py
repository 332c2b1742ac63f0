"""Upstream SGLang launch_server flags this engine refuses by name, each with what to use instead,
and the short one-line errors of the launch_server parser (no 50-line usage dump)."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

NO_LORA = "LoRA adapters are not served; merge the adapter into the weights and serve the merged checkpoint"
NO_PD = "prefill-decode disaggregation is not supported; run whole servers (--dp-size N behind sglang-router)"
NO_MULTI_NODE = "servers span one host; run one server per node behind sglang-router"
NO_EP = "expert parallelism is not supported (no mixture-of-experts model is served)"
NO_QUANT = "quantized models are not served yet; serve a bfloat16 / float16 checkpoint"
NO_MM = "multimodal models are not served; this engine serves text models"
NO_HUB = "nothing is downloaded; pass a local model directory to --model-path"
CUDA_GRAPHS = ("this engine captures CUDA graphs of decode and prefill steps instead (on by default; "
               "--cuda-graph-max-bs, --prefill-cuda-graph-max-tokens)")

# Flag -> why it is refused and what to use instead.
REFUSED_FLAGS = {
    # kernels and backends
    "--enable-torch-compile": CUDA_GRAPHS,
    "--torch-compile-max-bs": CUDA_GRAPHS,
    "--sampling-backend": "sampling runs on this engine's own kernels; there is no backend to choose",
    "--enable-mixed-chunk": ("prefill and decode run as separate steps; --chunked-prefill-size and "
                             "--admission-batch-steps shape the prefill passes"),
    "--prefill-attention-backend": "use --attention-backend triton (CUDA) or torch_native for every step",
    "--decode-attention-backend": "use --attention-backend triton (CUDA) or torch_native for every step",
    "--mm-attention-backend": NO_MM,
    # quantization
    "--quantization": NO_QUANT,
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
    "--enable-deterministic-inference": ("greedy requests and seeded sampled requests (sampling_seed) are "
                                         "already reproducible; see docs/http_api.md"),
    "--config": "give the flags on the command line",
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


def refuse_upstream_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    for arg in argv:
        if arg == "--":
            return
        flag = arg.split("=", 1)[0]
        if flag in REFUSED_FLAGS:
            parser.error(f"{flag} (an upstream SGLang flag) is not supported: {REFUSED_FLAGS[flag]}")
