"""--load-format: `dummy` serves a directory of config.json and tokenizer alone with random weights
(the same on every start, the draft's too), for measuring speed without a checkpoint; `safetensors`
and `pt` take only their own files."""

from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_loader.dummy import DUMMY_STD
from sglang.srt.model_loader.loader import load_model
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import make_tiny_eagle3_draft, make_tiny_model

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.index.json")


def config_only(src: str, dst: str) -> str:
    """A copy of a model directory without its weights."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*WEIGHT_PATTERNS))
    assert not any(glob.glob(os.path.join(dst, p)) for p in WEIGHT_PATTERNS)
    return dst


def greedy(args: ServerArgs, prompt: list[int], max_new_tokens: int = 12, verifies: list | None = None) -> list[int]:
    """The greedy tokens; `verifies` gets the request's verify steps (speculative servers)."""
    scheduler = Scheduler(args)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
    scheduler.add_request(TokenizedGenerateReqInput("r", prompt, params, stream=False))
    tokens = []
    while scheduler.has_work():
        out = scheduler.step()
        if out:
            tokens += out.new_token_ids[0]
            if verifies is not None and out.spec_verify_ct:
                verifies.append(out.spec_verify_ct[0])
    return tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and an EAGLE-3 draft with a smaller vocabulary, as config and tokenizer only."""
    root = tmp_path_factory.mktemp("load_format")
    target = make_tiny_model(str(root / "target"), "llama")
    draft = make_tiny_eagle3_draft(str(root / "draft"), target, draft_vocab_size=64)
    return target, config_only(target, str(root / "target_config")), config_only(draft, str(root / "draft_config"))


def test_dummy_weights_need_only_the_config_and_are_the_same_on_every_start(pair):
    full, target, _ = pair
    args = ServerArgs(model_path=target, device="cpu", dtype="float32", load_format="dummy")
    first = greedy(args, [5, 6, 7, 8])
    assert len(first) == 12 and first == greedy(args, [5, 6, 7, 8])
    assert greedy(ServerArgs(model_path=full, device="cpu", dtype="float32"), [5, 6, 7, 8]) != first
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):  # without dummy it needs weights
        load_model(ModelConfig.from_path(target, dtype="float32", device="cpu"), "cpu")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_dummy_weights_look_like_an_initialised_model(tmp_path, arch):
    """Matrices and embeddings N(0, 0.02), norm weights one, biases zero: finite activations."""
    path = config_only(make_tiny_model(str(tmp_path / "m"), arch), str(tmp_path / "c"))
    model = load_model(ModelConfig.from_path(path, dtype="float32", device="cpu"), "cpu", "dummy")
    seen = set()
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name
        if name.endswith("bias"):
            assert not param.any(), name
            seen.add("bias")
        elif "norm" in name:
            assert (param == 1).all(), name
            seen.add("norm")
        elif param.numel() > 1000:
            assert abs(param.std().item() - DUMMY_STD) < 0.2 * DUMMY_STD, name
    assert "norm" in seen and ("bias" in seen) == (arch == "qwen2")


def test_a_dummy_pair_speculates_and_gives_plain_decodings_tokens(pair):
    """The draft is drawn too (a head of its own for its smaller vocabulary, the identity
    vocabulary map): EAGLE-3 over the dummy target decodes exactly as the dummy target alone."""
    _, target, draft = pair
    plain = greedy(ServerArgs(model_path=target, device="cpu", dtype="float32", load_format="dummy"), [9, 10, 11])
    verifies = []
    spec = greedy(
        ServerArgs(
            model_path=target,
            device="cpu",
            dtype="float32",
            load_format="dummy",
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft,
            speculative_num_steps=3,
        ),
        [9, 10, 11],
        verifies=verifies,
    )
    assert spec == plain
    assert verifies and max(verifies) > 0, "the draft ran and its tokens were verified"


def test_safetensors_and_pt_take_only_their_own_files(pair):
    full, _, _ = pair
    config = ModelConfig.from_path(full, dtype="float32", device="cpu")
    assert load_model(config, "cpu", "safetensors") is not None
    with pytest.raises(FileNotFoundError, match="--load-format pt"):
        load_model(config, "cpu", "pt")
    with pytest.raises(SystemExit):
        from sglang.srt.server_args import prepare_server_args

        prepare_server_args(["--load-format", "gguf"])
