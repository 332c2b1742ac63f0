"""ServerArgs: bad values fail naming their flag and what is allowed, defaults fill from other
fields and the machine, the args are read-only, and upstream SGLang's flag names parse."""

import dataclasses

import json

import pytest
import torch

from sglang import demo
from sglang.srt.server_args import ServerArgs, prepare_server_args

MODEL = demo.TARGET_PATH  # the CLI checks that the model directory exists


def parse_error(capsys, argv):
    """Runs the CLI on argv, expects argparse's usage error, and returns its stderr."""
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--model-path", MODEL, *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, bad, allowed",
    [
        ("--dtype", "float64", ["auto", "float32", "bfloat16", "float16"]),
        ("--device", "tpu", ["cuda", "cpu"]),
        ("--schedule-policy", "random", ["fcfs", "lpm"]),
        ("--attention-backend", "flashinfer", ["torch_native"]),
        ("--log-level", "verbose", ["debug", "info", "warning", "error", "critical"]),
        ("--grammar-backend", "outlines", ["xgrammar", "none"]),
        ("--tool-call-parser", "deepseekv3", ["llama3", "qwen25", "hermes", "mistral"]),
    ],
)
def test_cli_bad_choice_exits_2_naming_flag_and_allowed_values(capsys, flag, bad, allowed):
    err = parse_error(capsys, [flag, bad])
    assert flag in err
    assert bad in err
    for choice in allowed:
        assert choice in err


@pytest.mark.parametrize(
    "field, flag, allowed",
    [
        ("dtype", "--dtype", "float32"),
        ("device", "--device", "cpu"),
        ("schedule_policy", "--schedule-policy", "lpm"),
        ("attention_backend", "--attention-backend", "torch_native"),
        ("log_level", "--log-level", "warning"),
        ("grammar_backend", "--grammar-backend", "xgrammar"),
        ("tool_call_parser", "--tool-call-parser", "qwen25"),
    ],
)
def test_constructor_bad_choice_names_flag_and_allowed_values(field, flag, allowed):
    with pytest.raises(ValueError) as exc:
        ServerArgs(model_path=MODEL, **{field: "nonsense"})
    message = str(exc.value)
    assert flag in message and allowed in message and "nonsense" in message


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_mem_fraction_static_outside_open_unit_interval_is_rejected(fraction):
    with pytest.raises(ValueError, match="--mem-fraction-static.*\\(0, 1\\)"):
        ServerArgs(model_path=MODEL, mem_fraction_static=fraction)


@pytest.mark.parametrize("fraction", [0.01, 0.85, 0.99])
def test_mem_fraction_static_inside_open_unit_interval_is_accepted(fraction):
    assert ServerArgs(model_path=MODEL, mem_fraction_static=fraction).mem_fraction_static == fraction


@pytest.mark.parametrize(
    "field, flag",
    [
        ("context_length", "--context-length"),
        ("max_total_tokens", "--max-total-tokens"),
        ("max_running_requests", "--max-running-requests"),
        ("chunked_prefill_size", "--chunked-prefill-size"),
    ],
)
@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_sizes_are_rejected_naming_flag(field, flag, value):
    with pytest.raises(ValueError, match=f"{flag} must be a positive integer"):
        ServerArgs(model_path=MODEL, **{field: value})


def test_non_positive_size_on_cli_exits_2_naming_flag(capsys):
    err = parse_error(capsys, ["--max-total-tokens", "0"])
    assert "--max-total-tokens must be a positive integer" in err


@pytest.mark.parametrize("port", [0, -1, 65536, 100000])
def test_port_out_of_range_is_rejected(port):
    with pytest.raises(ValueError, match="--port must be in \\[1, 65535\\]"):
        ServerArgs(model_path=MODEL, port=port)


@pytest.mark.parametrize("port", [1, 65535])
def test_port_at_range_edges_is_accepted(port):
    assert ServerArgs(model_path=MODEL, port=port).port == port


def test_tp_size_two_is_accepted():
    assert ServerArgs(model_path=MODEL, tp_size=2).tp_size == 2


def test_tp_size_that_cannot_split_the_model_exits_2_with_the_reason(capsys):
    err = parse_error(capsys, ["--tp-size", "3"])
    assert "--tp-size 3 cannot split the model: its 4 attention heads do not divide by 3" in err


def test_tokenizer_path_and_served_model_name_default_to_model_path():
    args = ServerArgs(model_path=MODEL)
    assert args.tokenizer_path == MODEL
    assert args.served_model_name == MODEL


def test_explicit_tokenizer_path_and_served_model_name_are_kept():
    args = ServerArgs(model_path=MODEL, tokenizer_path="/tok", served_model_name="tiny")
    assert (args.tokenizer_path, args.served_model_name) == ("/tok", "tiny")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the default device is cuda on a GPU machine")
def test_device_defaults_to_cpu_without_cuda():
    assert ServerArgs(model_path=MODEL).device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_device_cuda_without_a_gpu_is_rejected():
    with pytest.raises(ValueError, match="--device cuda.*no CUDA device"):
        ServerArgs(model_path=MODEL, device="cuda")


def test_attention_backend_defaults_to_torch_native():
    assert ServerArgs(model_path=MODEL).attention_backend == "torch_native"


def test_cli_defaults_match_constructor_defaults():
    assert prepare_server_args(["--model-path", MODEL]) == ServerArgs(model_path=MODEL)


def test_server_args_are_frozen():
    args = ServerArgs(model_path=MODEL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.max_total_tokens = 10
    assert args.max_total_tokens is None


def test_from_kwargs_rejects_unknown_keyword_naming_it():
    with pytest.raises(TypeError, match="max_batch_tokens"):
        ServerArgs.from_kwargs(model_path=MODEL, max_batch_tokens=8)


def test_from_kwargs_builds_validated_args():
    args = ServerArgs.from_kwargs(model_path=MODEL, chunked_prefill_size=16)
    assert args.chunked_prefill_size == 16
    with pytest.raises(ValueError, match="--chunked-prefill-size"):
        ServerArgs.from_kwargs(model_path=MODEL, chunked_prefill_size=0)


def test_upstream_flag_names_parse():
    args = prepare_server_args(
        [
            "--model-path",
            MODEL,
            "--tp-size",
            "1",
            "--disable-radix-cache",
            "--chunked-prefill-size",
            "64",
            "--schedule-policy",
            "lpm",
            "--mem-fraction-static",
            "0.5",
            "--context-length",
            "512",
            "--max-total-tokens",
            "4096",
            "--max-running-requests",
            "8",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--random-seed",
            "7",
            "--served-model-name",
            "tiny",
            "--port",
            "31000",
            "--host",
            "0.0.0.0",
            "--log-level",
            "warning",
            "--tokenizer-path",
            MODEL,
        ]
    )
    assert args == ServerArgs(
        model_path=MODEL,
        tp_size=1,
        disable_radix_cache=True,
        chunked_prefill_size=64,
        schedule_policy="lpm",
        mem_fraction_static=0.5,
        context_length=512,
        max_total_tokens=4096,
        max_running_requests=8,
        dtype="float32",
        device="cpu",
        random_seed=7,
        served_model_name="tiny",
        port=31000,
        host="0.0.0.0",
        log_level="warning",
        tokenizer_path=MODEL,
    )


def test_model_and_tensor_parallel_size_aliases_parse():
    args = prepare_server_args(["--model", MODEL, "--tensor-parallel-size", "1"])
    assert (args.model_path, args.tp_size) == (MODEL, 1)


def test_no_model_path_means_the_shipped_demo_model():
    from sglang import demo

    args = prepare_server_args([])
    assert args.model_path == demo.TARGET_PATH and args.served_model_name == demo.SERVED_MODEL_NAME


def test_a_replica_copy_takes_its_placement_and_nothing_else():
    """What upstream's `sglang_router.launch_server` does to each replica's copy of the args."""
    import copy

    args = ServerArgs(model_path=MODEL, device="cpu", dp_size=2)
    replica = copy.deepcopy(args)
    replica.port, replica.base_gpu_id, replica.dp_size = 31001, 1, 1
    assert (replica.port, replica.base_gpu_id, replica.dp_size) == (31001, 1, 1)
    assert (args.port, args.base_gpu_id, args.dp_size) == (30000, 0, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        replica.model_path = "/elsewhere"
    with pytest.raises(ValueError, match="--port"):
        replica.port = 0
    with pytest.raises(ValueError, match="--dp-size"):
        replica.dp_size = 0


def test_data_parallel_flags_parse_and_check(capsys):
    args = prepare_server_args(
        ["--model-path", MODEL, "--device", "cpu", "--data-parallel-size", "3", "--base-gpu-id", "2"]
    )
    assert (args.dp_size, args.base_gpu_id, args.replicas_per_gpu) == (3, 2, 1)  # CPU replicas just share
    assert "--base-gpu-id must be >= 0" in parse_error(capsys, ["--device", "cpu", "--base-gpu-id", "-1"])
    with pytest.raises(ValueError, match="grpc_mode"):
        ServerArgs(model_path=MODEL, device="cpu", grpc_mode=True)


def test_structured_output_flags_parse_and_a_missing_chat_template_is_named(tmp_path, capsys):
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    args = prepare_server_args(
        [
            "--model-path",
            MODEL,
            "--grammar-backend",
            "none",
            "--tool-call-parser",
            "llama3",
            "--chat-template",
            str(template),
        ]
    )
    assert (args.grammar_backend, args.tool_call_parser, args.chat_template) == ("none", "llama3", str(template))
    assert ServerArgs(model_path="m").grammar_backend == "xgrammar"  # upstream's default
    err = parse_error(capsys, ["--chat-template", str(tmp_path / "missing.jinja")])
    assert "--chat-template" in err and "missing.jinja" in err


def test_help_groups_flags_as_upstream_does_and_shows_each_default(capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    groups = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    for title in (
        "model and tokenizer",
        "HTTP server",
        "memory",
        "scheduling",
        "speculative decoding",
        "logging",
        "metrics",
    ):
        assert title in groups, (title, groups)
    assert "other" not in groups, "every flag belongs to a group (cli_help.HELP_GROUPS)"
    flat = " ".join(text.split())  # help text is wrapped
    for flag, default in (
        ("--port PORT", "30000"),
        ("--host HOST", "127.0.0.1"),
        ("--log-level", "info"),
        ("--mem-fraction-static", "0.85"),
        ("--chunked-prefill-size", "8192"),
        ("--cuda-graph-max-bs", "256"),
        ("--enable-metrics", "False"),
    ):
        entry = flat[flat.index(flag, flat.index("options:")) :]
        assert f"(default: {default})" in entry[:400], (flag, entry[:400])


def test_every_flag_has_help_and_says_its_default():
    """Flags whose default is not None show it; a None default depends on other flags or the
    machine, and the help text says what it is."""
    import argparse

    from sglang.srt.cli_help import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        if action.option_strings == ["-h", "--help"]:
            continue
        assert action.help, f"{action.option_strings[0]} has no help text"
        if action.default is None:
            assert "default" in action.help.lower(), f"{action.option_strings[0]} does not say its default"


@pytest.mark.parametrize(
    "path, message",
    [
        ("/no/such/model", "'/no/such/model' does not exist"),
        ("meta-llama/Llama-3.1-8B-Instruct", "weights are not downloaded"),
    ],
)
def test_a_missing_model_or_hub_id_is_one_line_naming_the_flag(capsys, path, message):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["--model-path", path])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--model-path" in err and message in err, err


def test_a_directory_without_config_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path)])
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "architecture, message",
    [
        ("DeepseekV3ForCausalLM", "not supported as a model to serve; supported: LlamaForCausalLM"),
        ("LlamaForCausalLMEagle3", "pass it as --speculative-draft-model-path"),
    ],
)
def test_an_architecture_the_engine_cannot_serve_is_refused_before_start_up(tmp_path, capsys, architecture, message):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path)])
    err = capsys.readouterr().err
    assert architecture in err and message in err and "--model-path" in err, err


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_config_json_that_is_not_an_object_is_named(tmp_path, capsys, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", str(tmp_path)])
    err = capsys.readouterr().err
    assert str(tmp_path / "config.json") in err and len(err.strip().splitlines()) == 1, err


def test_a_draft_must_be_an_eagle3_draft(tmp_path, capsys):
    from sglang import demo

    with pytest.raises(SystemExit):
        prepare_server_args(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", demo.TARGET_PATH])
    err = capsys.readouterr().err
    assert "--speculative-draft-model-path" in err and "'LlamaForCausalLM'" in err and "an EAGLE-3 draft" in err, err


def test_a_feature_may_keep_its_flags_in_a_group_of_its_own(capsys):
    import argparse

    from sglang.srt.cli_help import DefaultsHelpFormatter, HelpGroups

    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    groups = HelpGroups(parser)
    groups.add_argument("--port", type=int, default=1, help="Port.")
    groups.add_argument_group("structured outputs").add_argument(
        "--grammar-backend", default="xgrammar", help="Grammar library."
    )
    parser.print_help()
    text = capsys.readouterr().out
    http = text.index("HTTP server:")
    assert http < text.index("--port PORT", http) < text.index("structured outputs:")
    assert "--grammar-backend GRAMMAR_BACKEND" in text and "(default: xgrammar)" in text


@pytest.mark.parametrize(
    "argv, fields",
    [
        (["--dtype", "half"], {"dtype": "half"}),
        (["--dtype", "float"], {"dtype": "float"}),
        (["--trust-remote-code"], {"trust_remote_code": True}),
        (["--tokenizer-mode", "slow"], {"tokenizer_mode": "slow"}),
        (["--max-prefill-tokens", "4096"], {"max_prefill_tokens": 4096}),
        (["--stream-interval", "8"], {"stream_interval": 8}),
        (["--log-requests", "--log-requests-level", "3"], {"log_requests": True, "log_requests_level": 3}),
        (["--watchdog-timeout", "600"], {"watchdog_timeout": 600.0}),
        (["--kv-cache-dtype", "auto"], {"kv_cache_dtype": "auto"}),
        (["--kv-cache-dtype", "fp8_e4m3"], {"kv_cache_dtype": "fp8_e4m3"}),
        (["--kv-cache-dtype", "fp8_e5m2"], {"kv_cache_dtype": "fp8_e5m2"}),
        (["--tp", "1", "--dp", "1"], {"tp_size": 1, "dp_size": 1}),  # upstream's short names (argparse abbreviations)
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else "",
)
def test_upstream_flags_with_a_meaning_here_parse(argv, fields):
    assert prepare_server_args(["--model-path", MODEL, *argv]) == ServerArgs(model_path=MODEL, **fields)


def test_upstream_dtype_aliases_resolve_to_their_dtypes():
    from sglang.srt.configs.model_config import ModelConfig

    assert ModelConfig.from_path(MODEL, "half").dtype == torch.float16
    assert ModelConfig.from_path(MODEL, "float").dtype == torch.float32


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--attention-backend", "fa3"], ["--attention-backend fa3", "triton", "torch_native"]),
        (["--attention-backend", "flashinfer"], ["--attention-backend flashinfer", "triton", "torch_native"]),
        (["--enable-torch-compile"], ["--enable-torch-compile", "CUDA graphs"]),
        (["--sampling-backend", "flashinfer"], ["--sampling-backend", "own kernels"]),
        (["--enable-mixed-chunk"], ["--enable-mixed-chunk", "--chunked-prefill-size"]),
        (["--quantization=awq"], ["--quantization", "awq", "fp8"]),
        (["--modelopt-quant", "fp8"], ["--modelopt-quant", "not served yet", "--quantization fp8"]),
        (["--enable-lora"], ["--enable-lora", "LoRA"]),
    ],
)
def test_refused_upstream_flags_fail_in_a_line_or_two_naming_the_flag_and_what_to_use(capsys, argv, names):
    err = parse_error(capsys, argv)
    assert len(err.strip().splitlines()) <= 2 and "usage:" not in err, err
    for name in names:
        assert name in err, (name, err)


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["--max-prefil-tokens", "4"], "did you mean --max-prefill-tokens?"),
        (["--no-such-flag"], ""),
    ],
)
def test_an_unknown_flag_is_named_with_the_nearest_known_flag_and_a_pointer_to_help(capsys, argv, hint):
    err = parse_error(capsys, argv)
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "usage:" not in err, err
    assert f"unknown flag {argv[0]}" in lines[0] and hint in lines[0] and "--help" in lines[1], err
    if not hint:
        assert "did you mean" not in err


def test_the_dp_launcher_gives_the_same_short_errors(capsys):
    from sglang.srt.entrypoints.replicas import parse_launch_args

    for argv, expected in (
        (["--max-prefil-tokens", "4"], "did you mean --max-prefill-tokens?"),
        (["--enable-torch-compile"], "CUDA graphs"),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_launch_args(["--model-path", MODEL, *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and expected in err and "usage:" not in err, err


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_prefill_tokens", 0, "--max-prefill-tokens must be a positive integer"),
        ("stream_interval", 0, "--stream-interval must be a positive integer"),
        ("watchdog_timeout", 0, "--watchdog-timeout must be > 0"),
        ("log_requests_level", 4, "--log-requests-level must be one of 0, 1, 2, 3"),
        ("tokenizer_mode", "fast", "--tokenizer-mode must be one of auto, slow"),
    ],
)
def test_bad_values_of_the_upstream_flags_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path=MODEL, **{field: value})
