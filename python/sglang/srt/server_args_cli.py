"""The `launch_server` flags: each flag's name, help text and default (the defaults are
ServerArgs's own), in the --help groups of cli_help."""

from __future__ import annotations

import argparse
import dataclasses

from sglang.srt.cli_help import HelpGroups
from sglang.srt.server_args import (
    ATTENTION_BACKEND_CHOICES,
    DEVICE_CHOICES,
    DRAFT_SYNC_CHOICES,
    DTYPE_CHOICES,
    GRAMMAR_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    QUANTIZATION_CHOICES,
    LOG_REQUESTS_LEVEL_CHOICES,
    LOAD_FORMAT_CHOICES,
    LOG_LEVEL_CHOICES,
    MAX_SPECULATIVE_STEPS,
    REASONING_PARSER_CHOICES,
    SAMPLING_DEFAULTS_CHOICES,
    SCHEDULE_POLICY_CHOICES,
    SPECULATIVE_ALGORITHM_CHOICES,
    TOKENIZER_MODE_CHOICES,
    TOOL_CALL_PARSER_CHOICES,
    ServerArgs,
)
from sglang.srt.server_args_refused import ATTENTION_BACKEND_ALTERNATIVE, add_already_the_behaviour_flags
from sglang.srt.speculative.spec_policy import policy_help

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(ServerArgs)}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Adds every ServerArgs flag to `parser`, in the order the --help usage line lists them."""
    parser = HelpGroups(parser)  # each flag lands in its --help group (cli_help.HELP_GROUPS)
    _add_model_args(parser)
    _add_runtime_args(parser)
    _add_http_server_args(parser)
    _add_parallelism_args(parser)
    _add_api_args(parser)
    _add_step_launch_args(parser)
    _add_speculative_args(parser)
    _add_structured_output_args(parser)
    add_already_the_behaviour_flags(parser)


def _add_model_args(parser: HelpGroups) -> None:
    """What is served: the checkpoint, its tokenizer, dtype and device."""
    parser.add_argument(
        "--model-path",
        "--model",
        type=str,
        default=None,
        help="Hugging Face model directory (config.json, *.safetensors, tokenizer). "
        "Default: the small Python code model shipped in sglang/demo, served "
        "as 'sglang-demo-code'.",
    )
    parser.add_argument(
        "--tokenizer-path", type=str, default=None, help="Tokenizer directory; defaults to --model-path."
    )
    parser.add_argument(
        "--tokenizer-mode",
        type=str,
        default=_DEFAULTS["tokenizer_mode"],
        choices=TOKENIZER_MODE_CHOICES,
        help="auto: the fast (Rust) tokenizer; slow: the Python one where transformers has it "
        "(transformers 5 loads only fast tokenizers: slow then logs a warning).",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Let transformers run Python files of the model directory that define its config "
        "and tokenizer classes (the model itself runs on this engine's own layers).",
    )
    parser.add_argument(
        "--dtype",
        type=str,
        default=_DEFAULTS["dtype"],
        choices=DTYPE_CHOICES,
        help="Weight and activation dtype; 'auto' takes the checkpoint's 16-bit dtype "
        "(bfloat16 on CUDA and float32 on CPU for a float32 checkpoint). 'half' and "
        "'float' are float16 and float32.",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        type=str,
        default=_DEFAULTS["kv_cache_dtype"],
        help=f"KV cache dtype: {', '.join(KV_CACHE_DTYPE_CHOICES)}. 'auto': the model's dtype. fp8_e4m3 / "
        "fp8_e5m2: K and V stored in FP8 with one k and one v scale per layer, read from the checkpoint "
        "(self_attn.k_scale / v_scale, kv_scale, k_proj.output_scale ...) else 1.0; about twice the tokens "
        "of a bf16 cache in the same memory. An EAGLE-3 draft's KV stays in the model's dtype.",
    )
    parser.add_argument(
        "--quantization",
        type=str,
        default=_DEFAULTS["quantization"],
        choices=QUANTIZATION_CHOICES,
        help="'fp8': quantize an unquantized checkpoint's linear layers to FP8 at load (one scale per output "
        "row; activations per token). Default: none; FP8 checkpoints need no flag (their config.json says "
        "their layout).",
    )
    parser.add_argument(
        "--load-format",
        type=str,
        default=_DEFAULTS["load_format"],
        choices=LOAD_FORMAT_CHOICES,
        help="How to read the weights: 'auto' takes *.safetensors, else pytorch_model*.bin; "
        "'safetensors' / 'pt' only those; 'dummy' reads none and draws random weights "
        "(the draft's too), for measuring speed with only config.json and a tokenizer.",
    )
    parser.add_argument(
        "--device",
        type=str,
        default=None,
        choices=DEVICE_CHOICES,
        help="Device to run on; defaults to cuda when available, else cpu.",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="Maximum tokens per request (prompt + output); defaults to the model's max_position_embeddings.",
    )


def _add_runtime_args(parser: HelpGroups) -> None:
    """Memory, scheduling, attention kernels and logging."""
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=_DEFAULTS["mem_fraction_static"],
        help="Fraction of GPU memory for weights and the KV cache.",
    )
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="Size of the KV pool in tokens. Default: derived from --mem-fraction-static.",
    )
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="Maximum number of requests decoded together. Default: derived from the KV pool's size.",
    )
    parser.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=_DEFAULTS["chunked_prefill_size"],
        help="Maximum prompt tokens prefilled in one step; longer prompts are chunked.",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=_DEFAULTS["max_prefill_tokens"],
        help="Most prompt tokens one prefill step takes over all its requests; with "
        "--chunked-prefill-size, the smaller of the two bounds a step.",
    )
    parser.add_argument(
        "--admission-batch-steps",
        type=int,
        default=_DEFAULTS["admission_batch_steps"],
        help="While requests decode, prefill passes are shaped to the prefill CUDA graphs: a "
        "pass takes no more requests than a graph does (unless eager launches beat the "
        "graphs there), and (with 32 or more decoding) a "
        "new request may wait up to this many decode steps, and no longer than a pass "
        "takes, for others to share its pass (it goes at once when 1/16 of the running "
        "number, 16 requests or one pass's tokens wait). 0 admits every request as soon "
        "as it can run, as many per pass as --chunked-prefill-size allows.",
    )
    parser.add_argument(
        "--schedule-policy",
        type=str,
        default=_DEFAULTS["schedule_policy"],
        choices=SCHEDULE_POLICY_CHOICES,
        help="Order of waiting requests: fcfs or lpm (longest cached prefix first).",
    )
    parser.add_argument(
        "--disable-radix-cache", action="store_true", help="Do not reuse the KV of shared prompt prefixes."
    )
    parser.add_argument(
        "--random-seed",
        type=int,
        default=_DEFAULTS["random_seed"],
        help="Seed for requests that do not give sampling_seed.",
    )
    parser.add_argument(
        "--attention-backend",
        type=str,
        default=None,
        help=f"Attention kernels: {' or '.join(ATTENTION_BACKEND_CHOICES)}; triton is the default "
        "on CUDA, torch_native (the reference) on CPU. Upstream's other backends (fa3, "
        f"flashinfer, ...) are refused: {ATTENTION_BACKEND_ALTERNATIVE}.",
    )
    parser.add_argument(
        "--log-level",
        type=str,
        default=_DEFAULTS["log_level"],
        choices=LOG_LEVEL_CHOICES,
        help="Logging level of every server process.",
    )
    parser.add_argument(
        "--log-requests",
        action="store_true",
        help="Log each request as it arrives and as it finishes (shown whatever --log-level), "
        "with the detail of --log-requests-level.",
    )
    parser.add_argument(
        "--log-requests-level",
        type=int,
        default=_DEFAULTS["log_requests_level"],
        choices=LOG_REQUESTS_LEVEL_CHOICES,
        help="With --log-requests: 0 ids and token counts; 1 also the sampling parameters; "
        "2 also the input and output, cut to 2048 characters each; 3 all of them.",
    )
    parser.add_argument(
        "--watchdog-timeout",
        type=float,
        default=_DEFAULTS["watchdog_timeout"],
        help="Seconds one scheduler step may run; a scheduler stuck longer exits with an error "
        "naming the watchdog, its stack is dumped, and the server fails its requests "
        "and exits non-zero.",
    )
    parser.add_argument(
        "--gc-warning-threshold-secs",
        type=float,
        default=_DEFAULTS["gc_warning_threshold_secs"],
        help="Log a warning when Python's garbage collector pauses a server process this many "
        "seconds or longer (default 0: no warning). Objects made at start-up are frozen out "
        "of its passes either way.",
    )


def _add_http_server_args(parser: HelpGroups) -> None:
    """Where the HTTP server listens and the name it serves."""
    parser.add_argument(
        "--served-model-name", type=str, default=None, help="Model name reported by the API; defaults to --model-path."
    )
    parser.add_argument(
        "--host",
        type=str,
        default=_DEFAULTS["host"],
        help="Address the HTTP server listens on (0.0.0.0 for every interface).",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=_DEFAULTS["port"],
        help="Port the HTTP server listens on; checked free before the model loads.",
    )


def _add_parallelism_args(parser: HelpGroups) -> None:
    parser.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        type=int,
        default=_DEFAULTS["tp_size"],
        help="Tensor-parallel ranks: the model (and an EAGLE-3 draft) split Megatron-style over "
        "this many processes, one GPU each from --base-gpu-id on (gloo on the CPU). "
        "Attention heads and the intermediate size must divide by it; key-value heads "
        "must divide by it or divide it (then they are replicated). Under tensor "
        "parallelism steps run without CUDA graphs (docs/tensor_parallel.md).",
    )
    parser.add_argument(
        "--dp-size",
        "--data-parallel-size",
        type=int,
        default=_DEFAULTS["dp_size"],
        help="Replicas of the whole server behind sglang-router (pip install 'sglang[router]'), "
        "each on its own GPU from --base-gpu-id on, or sharing GPUs (and their memory) when "
        "there are more replicas than GPUs. --router-* flags configure the router.",
    )
    parser.add_argument(
        "--base-gpu-id",
        type=int,
        default=_DEFAULTS["base_gpu_id"],
        help="The GPU this server (its first replica) runs on; replica i takes the next ones.",
    )


def _add_api_args(parser: HelpGroups) -> None:
    """What the API accepts from one request, and what it serves besides generation."""
    parser.add_argument(
        "--sampling-defaults",
        type=str,
        default=_DEFAULTS["sampling_defaults"],
        choices=SAMPLING_DEFAULTS_CHOICES,
        help="Where /v1/chat/completions takes the temperature, top_p, top_k, min_p and "
        "repetition_penalty a request leaves unset: model (the model's "
        "generation_config.json, where it recommends them; else OpenAI's) or openai "
        "(OpenAI's: temperature 1, top_p 1, no top_k, min_p or repetition penalty). A "
        "request's own values always win; /v1/completions and /generate keep these fixed "
        "defaults either way.",
    )
    parser.add_argument(
        "--api-key",
        type=str,
        default=None,
        help="Require 'Authorization: Bearer <key>' on every route but /health* and /metrics. Default: no key.",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="Requests allowed to wait beyond --max-running-requests; more get HTTP 503. Unlimited by default.",
    )
    parser.add_argument(
        "--max-payload-size",
        type=int,
        default=_DEFAULTS["max_payload_size"],
        help="Largest request body in bytes; a larger one gets HTTP 413 (default 256 MiB, as sglang-router).",
    )
    parser.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=_DEFAULTS["max_sequences_per_request"],
        help="Most sequences one request may ask for (prompts x n); more get HTTP 400. "
        "Default 256 on a GPU, 16 on the CPU (where every sequence in the batch "
        "slows every other request's decode steps).",
    )
    parser.add_argument(
        "--max-stop-strings",
        type=int,
        default=_DEFAULTS["max_stop_strings"],
        help="Most stop strings one request may give; more get HTTP 400.",
    )
    parser.add_argument(
        "--max-stop-str-len",
        type=int,
        default=_DEFAULTS["max_stop_str_len"],
        help="Longest stop string in characters; a longer one gets HTTP 400.",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=_DEFAULTS["stream_interval"],
        help="Output tokens per streamed chunk: a streaming request gets a chunk once this many "
        "new tokens are ready, and a last one when it finishes. Larger values cost the "
        "server less per token.",
    )
    parser.add_argument("--enable-metrics", action="store_true", help="Serve Prometheus metrics at /metrics.")
    parser.add_argument(
        "--skip-server-warmup", action="store_true", help="Report ready without running a warm-up generation first."
    )


def _add_step_launch_args(parser: HelpGroups) -> None:
    """How decode and prefill steps reach the device: overlapped, eager or from CUDA graphs."""
    parser.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="Process each decode step's results before launching the next (by default "
        "the CPU prepares step N+1 while the device runs step N).",
    )
    parser.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="Run decode steps eagerly instead of replaying captured CUDA graphs.",
    )
    parser.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=_DEFAULTS["cuda_graph_max_bs"],
        help="Largest decode batch captured in a CUDA graph (buckets 1, 2, 4, 8, then "
        "every 8 to 64 and every 16 beyond); larger batches run eagerly.",
    )
    parser.add_argument(
        "--cuda-graph-bs",
        type=int,
        nargs="+",
        default=None,
        help="Explicit list of batch sizes to capture. Default: the buckets up to --cuda-graph-max-bs.",
    )
    parser.add_argument(
        "--prefill-cuda-graph-max-tokens",
        type=int,
        default=_DEFAULTS["prefill_cuda_graph_max_tokens"],
        help="Largest prefill (in new tokens, up to 16 requests) replayed from a CUDA graph; "
        "each graph is kept only where it beats launching the forward eagerly, "
        "measured at start-up. 0 turns prefill graphs off.",
    )


def _add_speculative_args(parser: HelpGroups) -> None:
    parser.add_argument(
        "--speculative-algorithm",
        type=str,
        default=None,
        choices=SPECULATIVE_ALGORITHM_CHOICES,
        help="EAGLE3 (EAGLE is accepted as the same): a one-layer draft proposes "
        "--speculative-num-steps tokens per step and the target verifies them at once. "
        "Off by default.",
    )
    parser.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        type=str,
        default=None,
        help="EAGLE-3 draft checkpoint (LlamaForCausalLMEagle3). Defaults to the demo draft "
        "when the target is the demo model.",
    )
    parser.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        help=f"Draft tokens per step, k (default 3; at most {MAX_SPECULATIVE_STEPS}).",
    )
    parser.add_argument(
        "--speculative-eagle-topk",
        type=int,
        default=None,
        help="Draft branching; must be 1 (chain drafting), the default.",
    )
    parser.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="Tokens verified per step; must be k + 1, the default.",
    )
    parser.add_argument(
        "--speculative-token-map",
        type=str,
        default=None,
        help="Not supported (default: none): EAGLE-3 checkpoints carry their reduced vocabulary (d2t).",
    )
    parser.add_argument(
        "--speculative-adaptive",
        action="store_true",
        help="Dynamic speculation: each decode step either speculates with one of the "
        "candidate k or decodes plainly, whichever the policy expects to give more tokens "
        "per second (default policy: cost).",
    )
    parser.add_argument(
        "--speculative-adaptive-config",
        type=str,
        default=None,
        help="JSON file in upstream's format: batch-size lower bounds (integer keys) to candidate "
        'steps, e.g. {"1": [0, 1, 3], "64": [0]}; implies --speculative-adaptive. '
        "Default: none (candidates from --speculative-candidate-steps).",
    )
    parser.add_argument(
        "--speculative-policy",
        type=str,
        default=None,
        help=f"How each decode step chooses k: {policy_help()}.",
    )
    parser.add_argument(
        "--speculative-threshold",
        type=int,
        default=None,
        help="For --speculative-policy threshold: the largest decode batch that speculates "
        "(no default: required by that policy).",
    )
    parser.add_argument(
        "--speculative-candidate-steps",
        type=_int_list,
        default=None,
        help="For --speculative-policy cost: the k it chooses from, comma separated, 0 = a plain "
        "step (default: 0, 1 and --speculative-num-steps).",
    )
    parser.add_argument(
        "--speculative-draft-sync",
        type=str,
        default=None,
        choices=DRAFT_SYNC_CHOICES,
        help="How the draft follows plain steps: warm (default; each plain step also extends "
        "the draft by its token, so speculation resumes with no catch-up) or catch-up (plain "
        "steps run the target only and keep its aux hidden states; the first speculative "
        "step after them extends the draft over all of them in one forward).",
    )
    parser.add_argument(
        "--disable-speculative-step-graph",
        action="store_true",
        help="Replay one graph per forward of a greedy speculative step (draft chain steps, "
        "verify, draft extend) instead of one graph for the whole step.",
    )


def _add_structured_output_args(parser: HelpGroups) -> None:
    group = parser.add_argument_group("structured outputs and tool calling")
    group.add_argument(
        "--grammar-backend",
        type=str,
        default="xgrammar",
        choices=GRAMMAR_BACKEND_CHOICES,
        help="Backend of json_schema / regex / ebnf constraints and response_format: xgrammar, or "
        "none (constrained requests are refused with 400).",
    )
    group.add_argument(
        "--tool-call-parser",
        type=str,
        default=None,
        choices=TOOL_CALL_PARSER_CHOICES,
        help="How tool calls are read from the model's output with tool_choice auto: llama3 "
        '(JSON objects {"name", "parameters"}), qwen25 / qwen / hermes '
        '(<tool_call>{"name", "arguments"}</tool_call>) or mistral ([TOOL_CALLS] and a JSON '
        'list of {"name", "arguments"}, or [TOOL_CALLS]name[ARGS]{...}). Default: none (calls '
        "are read only where tool_choice is required or names a function).",
    )
    group.add_argument(
        "--reasoning-parser",
        type=str,
        default=None,
        choices=REASONING_PARSER_CHOICES,
        help="Splits a thinking model's <think>...</think> block out of chat answers into "
        "reasoning_content: deepseek-r1 (the output starts inside the block, which the chat "
        "template opened) or qwen3 (a block only where the output opens one; none with "
        'chat_template_kwargs {"enable_thinking": false}). A chat request\'s json_schema, '
        "response_format or forced tool_choice then constrains the answer after the block. "
        "Default: none (the block stays in content).",
    )
    group.add_argument(
        "--chat-template",
        type=str,
        default=None,
        help="Path of a Jinja chat template used for /v1/chat/completions instead of the "
        "tokenizer's own (or where the tokenizer has none). Default: none (the tokenizer's template).",
    )


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
