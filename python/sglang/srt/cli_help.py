"""How `launch_server --help` reads: flags in groups, as upstream SGLang groups them, each with
its default."""

from __future__ import annotations

import argparse

# --help groups, as upstream SGLang groups its flags; a flag in no group shows under "other".
HELP_GROUPS = {
    "model and tokenizer": (
        "--model-path",
        "--tokenizer-path",
        "--tokenizer-mode",
        "--trust-remote-code",
        "--dtype",
        "--kv-cache-dtype",
        "--quantization",
        "--load-format",
        "--device",
        "--context-length",
    ),
    "HTTP server": (
        "--host",
        "--port",
        "--served-model-name",
        "--api-key",
        "--max-queued-requests",
        "--skip-server-warmup",
        "--max-payload-size",
        "--max-sequences-per-request",
        "--max-stop-strings",
        "--max-stop-str-len",
        "--sampling-defaults",
        "--stream-interval",
    ),
    "memory": ("--mem-fraction-static", "--max-total-tokens", "--disable-radix-cache"),
    "scheduling": (
        "--max-running-requests",
        "--chunked-prefill-size",
        "--max-prefill-tokens",
        "--admission-batch-steps",
        "--schedule-policy",
        "--random-seed",
        "--watchdog-timeout",
    ),
    "kernels and CUDA graphs": (
        "--attention-backend",
        "--disable-overlap-schedule",
        "--disable-cuda-graph",
        "--cuda-graph-max-bs",
        "--cuda-graph-bs",
        "--prefill-cuda-graph-max-tokens",
    ),
    "parallelism": ("--tp-size", "--dp-size", "--base-gpu-id"),
    "speculative decoding": ("--speculative-*", "--disable-speculative-step-graph"),
    "logging": ("--log-level", "--log-requests", "--log-requests-level", "--gc-warning-threshold-secs"),
    "metrics": ("--enable-metrics",),
}


class HelpGroups:
    """Stands in for the parser in add_cli_args: each flag goes to its HELP_GROUPS group."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.groups = {title: parser.add_argument_group(title) for title in [*HELP_GROUPS, "other"]}

    def add_argument(self, *names, **kwargs):
        return self.groups[help_group(names[0])].add_argument(*names, **kwargs)

    def add_argument_group(self, title: str, description: str | None = None):
        """A group of the caller's own: a feature that keeps its flags together."""
        if title not in self.groups:
            self.groups[title] = self.parser.add_argument_group(title, description)
        return self.groups[title]


def help_group(flag: str) -> str:
    for title, flags in HELP_GROUPS.items():
        if any(flag == f or (f.endswith("*") and flag.startswith(f[:-1])) for f in flags):
            return title
    return "other"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default; a default that depends on other flags or on the
    machine (None here) is said in the help text itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is argparse.SUPPRESS or "%(default)" in text:
            return text
        if not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"
