"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2: the KV pool stores K and V in FP8 with per-layer scales
(mem_cache/memory_pool.py, read from the checkpoint by model_loader/kv_scales.py), both attention
backends read it in every forward mode, and an engine serves with it: its greedy tokens follow the
float32 model's except at near-ties, speculative decoding stays lossless against its plain
decoding, and the pool holds twice the tokens of a bf16 one in the same memory."""

from __future__ import annotations

import logging
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import sglang
from sglang import demo
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor import model_runner as model_runner_module
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader.kv_scales import kv_scale_target, read_kv_cache_scales
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.test.fp8_agreement import MAX_NOISE, MIN_AGREEING, Agreement
from sglang.test.fp8_checkpoints import make_sharp_tiny_model, write_dequantized, write_fp8_checkpoint
from sglang.test.runner_utils import OneRank, prefill
from sglang.test.server_fixture import assert_engine_kv_accounting

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
K_SCALE, V_SCALE = 0.02, 0.05
GREEDY_FIRST = {"temperature": 0, "max_new_tokens": 1}


# ---- the pool -----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", FP8)
def test_pool_divides_by_the_scale_on_write_saturates_and_multiplies_back_on_read(flag):
    dtype = FP8[flag]
    pool = MHATokenToKVPool(8, dtype, KV_HEADS, HEAD_DIM, 2, "cpu", kv_scales={1: (K_SCALE, V_SCALE)})
    assert pool.get_kv_scales(0) == (1.0, 1.0) and pool.get_kv_scales(1) == (K_SCALE, V_SCALE)
    k = torch.randn(3, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    v = 2 * k
    k[0, 0, 0] = 1e6  # far past the format's range: saturates, never NaN
    loc = torch.tensor([5, 2, 7])
    pool.set_kv_buffer(1, loc, k, v)
    assert pool.get_key_buffer(1).dtype == dtype
    limit = torch.finfo(dtype).max
    assert torch.equal(pool.get_key_buffer(1)[loc], (k / K_SCALE).clamp(-limit, limit).to(dtype))
    k_real, v_real = pool.dequantized(1, loc)
    assert k_real[0, 0, 0] == limit * K_SCALE and torch.isfinite(k_real).all()
    mantissa_bits = 3 if dtype == torch.float8_e4m3fn else 2
    bound = 2.0 ** -(mantissa_bits + 1)  # half a unit in the last place, relative
    normal = k.abs() > 2.0**-6 * K_SCALE
    normal[0, 0, 0] = False
    assert ((k_real - k).abs() <= bound * k.abs())[normal].all()
    assert ((v_real - v).abs() <= bound * v.abs() + 2.0**-9 * V_SCALE).all()
    assert pool.get_key_buffer(0).float().abs().sum() == 0  # another layer untouched


def test_an_fp8_token_takes_half_the_bytes_of_a_bf16_one_and_scales_need_fp8():
    bf16 = MHATokenToKVPool.bytes_per_token(torch.bfloat16, 8, 128, 32)
    assert MHATokenToKVPool.bytes_per_token(torch.float8_e4m3fn, 8, 128, 32) * 2 == bf16 == 131072
    with pytest.raises(ValueError, match="FP8"):
        MHATokenToKVPool(4, torch.bfloat16, KV_HEADS, HEAD_DIM, 1, "cpu", kv_scales={0: (0.5, 0.5)})


# ---- the attention backends over an FP8 pool ----------------------------------------------


def fp8_batch(mode, prefix_lens, new_lens, q_dtype, kv_dtype, seed=0):
    """A batch whose requests have FP8 prefixes in the pool (scattered slots) and `new_lens` new
    tokens each, with their q, k, v; the backend stores the new K/V."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(prefix_lens) + sum(new_lens)
    pool = MHATokenToKVPool(total + 4, kv_dtype, KV_HEADS, HEAD_DIM, 1, "cpu", kv_scales={0: (K_SCALE, V_SCALE)})
    table = ReqToTokenPool(len(prefix_lens) + 2, max(p + n for p, n in zip(prefix_lens, new_lens)) + 2, "cpu")
    slots = (torch.randperm(total + 4, generator=gen)[:total] + 1).tolist()
    rows, new_slots = [3, 0, 2, 1][: len(prefix_lens)], []
    for row, prefix, new in zip(rows, prefix_lens, new_lens):
        taken, slots = torch.tensor(slots[: prefix + new]), slots[prefix + new :]
        table.write(row, 0, taken)
        kv = 5 * K_SCALE * torch.randn(2, prefix, KV_HEADS, HEAD_DIM, generator=gen)
        pool.set_kv_buffer(0, taken[:prefix], kv[0], kv[1] * V_SCALE / K_SCALE)
        new_slots.append(taken[prefix:])
    tokens = sum(new_lens)
    q = torch.randn(tokens, HEADS * HEAD_DIM, generator=gen).to(q_dtype)
    k = 5 * K_SCALE * torch.randn(tokens, KV_HEADS * HEAD_DIM, generator=gen).to(q_dtype)
    v = 5 * V_SCALE * torch.randn(tokens, KV_HEADS * HEAD_DIM, generator=gen).to(q_dtype)
    seq_lens = [p + n for p, n in zip(prefix_lens, new_lens)]
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, new_lens)]),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        out_cache_loc=torch.cat(new_slots),
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=list(new_lens),
        extend_prefix_lens_cpu=list(prefix_lens),
    )
    batch.req_to_token_pool, batch.token_to_kv_pool = table, pool
    return batch, q, k, v


def reference_on_dequantized_kv(batch, q) -> torch.Tensor:
    """Float32 causal attention over each request's K/V as the pool dequantizes them."""
    out, start, group = [], 0, HEADS // KV_HEADS
    q = q.float().view(-1, HEADS, HEAD_DIM)
    for i, (seq_len, new_len) in enumerate(zip(batch.seq_lens_cpu, batch.extend_seq_lens_cpu)):
        slots = batch.req_to_token_pool.req_to_token[batch.req_pool_indices[i], :seq_len].long()
        k, v = (t.repeat_interleave(group, dim=1) for t in batch.token_to_kv_pool.dequantized(0, slots))
        scores = torch.einsum("thd,shd->hts", q[start : start + new_len], k) * HEAD_DIM**-0.5
        visible = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - new_len, seq_len)[:, None]
        out.append(torch.einsum("hts,shd->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v))
        start += new_len
    return torch.cat(out).reshape(-1, HEADS * HEAD_DIM)


def make_backend(name):
    if name == "torch_native":
        return TorchNativeAttnBackend()
    runner = SimpleNamespace(model_config=SimpleNamespace(head_dim=HEAD_DIM), num_heads=HEADS, device="cpu")
    return TritonAttnBackend(runner)


# Decode; prefill with a cached prefix (and one without); a verify pass of k + 1 = 4 tokens per request.
SHAPES = {
    "decode": (ForwardMode.DECODE, [0, 37, 70], [1, 1, 1]),
    "extend": (ForwardMode.EXTEND, [0, 45, 6], [33, 7, 1]),
    "verify": (ForwardMode.TARGET_VERIFY, [12, 40, 1], [4, 4, 4]),
}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("flag", FP8)
def test_backend_over_fp8_kv_equals_float32_attention_on_the_dequantized_kv(backend, shape, flag):
    mode, prefix_lens, new_lens = SHAPES[shape]
    batch, q, k, v = fp8_batch(mode, prefix_lens, new_lens, torch.float32, FP8[flag])
    attn_backend = make_backend(backend)
    attn_backend.init_forward_metadata(batch)
    layer = RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, 0)
    out = attn_backend.forward(q, k, v, layer, batch)
    want = reference_on_dequantized_kv(batch, q)
    torch.testing.assert_close(out, want, atol=TOLERANCE[torch.float32], rtol=0)
    # The new tokens' K/V went into the pool as FP8 (the reference read them back from it).
    k_real, _ = batch.token_to_kv_pool.dequantized(0, batch.out_cache_loc)
    torch.testing.assert_close(k_real.view(k.shape), k, atol=0, rtol=2.0**-2)


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_bf16_activations_over_fp8_kv(backend):
    mode, prefix_lens, new_lens = SHAPES["verify"]
    batch, q, k, v = fp8_batch(mode, prefix_lens, new_lens, torch.bfloat16, torch.float8_e4m3fn)
    attn_backend = make_backend(backend)
    attn_backend.init_forward_metadata(batch)
    out = attn_backend.forward(q, k, v, RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, 0), batch)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), reference_on_dequantized_kv(batch, q), atol=TOLERANCE[torch.bfloat16], rtol=0
    )


# ---- scales from the checkpoint ------------------------------------------------------------


def test_the_published_kv_scale_names_are_recognised():
    assert kv_scale_target("model.layers.3.self_attn.k_scale") == (3, "k")
    assert kv_scale_target("model.layers.3.self_attn.v_scale") == (3, "v")
    assert kv_scale_target("model.layers.0.self_attn.kv_scale") == (0, "kv")
    assert kv_scale_target("model.layers.12.self_attn.k_proj.k_scale") == (12, "k")  # ModelOpt
    assert kv_scale_target("model.layers.12.self_attn.v_proj.v_scale") == (12, "v")
    assert kv_scale_target("model.layers.2.self_attn.k_proj.output_scale") == (2, "k")  # compressed-tensors
    assert kv_scale_target("model.layers.2.self_attn.v_proj.output_scale") == (2, "v")
    assert kv_scale_target("model.layers.2.self_attn.qkv_proj.k_scale") == (2, "k")
    for other in ("model.layers.2.self_attn.k_proj.weight_scale", "model.layers.2.self_attn.k_proj.input_scale"):
        assert kv_scale_target(other) is None


@pytest.fixture(scope="module")
def model_with_kv_scales(tiny_model_paths, tmp_path_factory):
    """The tiny llama with KV scales in three of the published spellings (layer 1 has only k)."""
    src = tiny_model_paths["llama"]
    dst = tmp_path_factory.mktemp("kv_scales")
    for name in os.listdir(src):
        if name != "model.safetensors":
            os.symlink(os.path.join(src, name), dst / name)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    tensors["model.layers.0.self_attn.k_scale"] = torch.tensor(0.03)
    tensors["model.layers.0.self_attn.v_scale"] = torch.tensor([0.04])
    tensors["model.layers.1.self_attn.k_proj.output_scale"] = torch.tensor([0.02, 0.05])  # per head
    tensors["model.layers.2.self_attn.kv_scale"] = torch.tensor(0.06)
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def runner_for(path, kv_cache_dtype, dtype="float32", quantization=None, **kwargs) -> ModelRunner:
    args = ServerArgs(
        model_path=path, dtype=dtype, device="cpu", kv_cache_dtype=kv_cache_dtype, quantization=quantization, **kwargs
    )
    return ModelRunner(ModelConfig.from_path(path, dtype=dtype, device="cpu", quantization=quantization), args)


def test_scales_are_read_from_the_checkpoint_and_the_model_loads_with_any_kv_dtype(model_with_kv_scales, caplog):
    assert read_kv_cache_scales([os.path.join(model_with_kv_scales, "model.safetensors")], 3) == {
        0: (pytest.approx(0.03), pytest.approx(0.04)),
        1: (pytest.approx(0.05), 1.0),
        2: (pytest.approx(0.06), pytest.approx(0.06)),
    }
    with pytest.raises(ValueError, match="layers.2.self_attn.kv_scale.* layer 2, but the model has 2 layers"):
        read_kv_cache_scales([os.path.join(model_with_kv_scales, "model.safetensors")], 2)
    with caplog.at_level(logging.INFO):
        runner = runner_for(model_with_kv_scales, "fp8_e4m3", max_total_tokens=256)
    pool = runner.token_to_kv_pool
    assert [pool.get_kv_scales(layer) for layer in range(3)] == [
        pytest.approx((0.03, 0.04)),
        pytest.approx((0.05, 1.0)),
        pytest.approx((0.06, 0.06)),
    ]
    assert "k/v scales of 3 of 3 layers from the checkpoint" in caplog.text
    # Without FP8 the scales are skipped: the same checkpoint serves a model-dtype cache.
    plain = runner_for(model_with_kv_scales, "auto", max_total_tokens=256)
    assert plain.token_to_kv_pool.dtype == torch.float32 and plain.token_to_kv_pool.get_kv_scales(2) == (1.0, 1.0)


# ---- first tokens against a float32 cache, on the sharp fixture ------------------------------

TOKEN_PROMPTS = [[5 + i, 40 + 3 * i, 90 + i, 7, 200 - i] for i in range(16)]
SHARP_SHAPE = dict(
    hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2
)
# The sharp fixture draws q_proj and k_proj at 0.02 like the rest: its attention scores are a few
# hundredths and its attention near uniform, so its first tokens would not notice K at all (a k_scale
# 1024 times too small moved its logits by under 1%). Drawn QK_GAIN times larger, attention picks
# positions and K matters: that k_scale then moves the logits by 10-17%.
QK_GAIN = 4
BROKEN_BY = 16  # k_scale and v_scale 16 times too small: e4m3 saturates the larger K and V at 1/16 of their range


def first_logits(path: str, kv_cache_dtype: str, quantization: str | None = None) -> torch.Tensor:
    """Each TOKEN_PROMPTS prompt's last logits [16, vocab] from a runner (float32 activations)."""
    runner = runner_for(path, kv_cache_dtype, max_total_tokens=256, quantization=quantization)
    vocab = runner.model_config.vocab_size
    return torch.stack([prefill(runner, prompt).next_token_logits.reshape(-1, vocab)[-1] for prompt in TOKEN_PROMPTS])


def calibrated_kv_scales(path: str) -> dict[int, tuple[float, float]]:
    """Per layer, the largest |K| and |V| the float32 cache holds over TOKEN_PROMPTS, over e4m3's 448."""
    runner = runner_for(path, "auto", max_total_tokens=256)
    pool, amax = runner.token_to_kv_pool, {}
    for prompt in TOKEN_PROMPTS:
        prefill(runner, prompt)  # its K/V stay in the freed slots until the next prompt overwrites them
        for layer in range(len(pool.k_buffer)):
            k, v = pool.get_key_buffer(layer).abs().max(), pool.get_value_buffer(layer).abs().max()
            old = amax.get(layer, (0.0, 0.0))
            amax[layer] = (max(old[0], float(k)), max(old[1], float(v)))
    limit = torch.finfo(torch.float8_e4m3fn).max
    return {layer: (k / limit, v / limit) for layer, (k, v) in amax.items()}


def with_kv_scales(src: str, dst, scales: dict[int, tuple[float, float]]) -> str:
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(dst, "model.safetensors"))
    for layer, (k_scale, v_scale) in scales.items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k_scale)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v_scale)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


@pytest.fixture(scope="module")
def sharp_kv_models(tmp_path_factory):
    """The sharp llama (QK_GAIN) with calibrated k/v scales; the same with both scales BROKEN_BY
    too small; and its weights quantized per channel and dequantized (the float32 model that
    --quantization fp8 computes, short of activation rounding)."""
    root = tmp_path_factory.mktemp("sharp_kv")
    src = make_sharp_tiny_model(str(root / "src"), "llama", **SHARP_SHAPE)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("q_proj.weight", "k_proj.weight"))]:
        tensors[name] = tensors[name] * QK_GAIN
    save_file(tensors, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    scales = calibrated_kv_scales(src)
    broken = {layer: (k / BROKEN_BY, v / BROKEN_BY) for layer, (k, v) in scales.items()}
    channel = write_fp8_checkpoint(src, str(root / "channel"), "ct-channel-dynamic", ["lm_head"])
    return SimpleNamespace(
        path=with_kv_scales(src, root / "calibrated", scales),
        broken=with_kv_scales(src, root / "broken", broken),
        dequantized=write_dequantized(channel, str(root / "dequantized")),
        scales=scales,
    )


@pytest.mark.parametrize("flag", FP8)
def test_fp8_kv_first_tokens_agree_with_the_float32_cache_but_at_near_ties(sharp_kv_models, flag):
    """The same model and calibrated scales with an FP8 and a float32 cache: the logits move by
    `noise` (measured 0.6% / 1.0% mean, 1.0% / 1.6% max for e4m3 / e5m2), at most MAX_NOISE, and
    the first greedy tokens agree on 15 of 16 prompts or more (measured 16 for both), each
    difference a near tie (fp8_agreement)."""
    agreement = Agreement(first_logits(sharp_kv_models.path, flag), first_logits(sharp_kv_models.path, "auto"))
    print(flag, agreement.summary())
    assert agreement.holds(), agreement.summary()


def test_online_fp8_weights_over_an_fp8_kv_cache_agree_with_dequantized_weights_and_a_float_cache(sharp_kv_models):
    """--quantization fp8 with --kv-cache-dtype fp8_e4m3 against the float32 model of the same
    per-channel weights with a float32 cache: activation and K/V rounding together move the logits
    by 1.1% (measured mean; 1.6% max), and the first tokens agree likewise (16 of 16)."""
    quantized = first_logits(sharp_kv_models.path, "fp8_e4m3", quantization="fp8")
    agreement = Agreement(quantized, first_logits(sharp_kv_models.dequantized, "auto"))
    print(agreement.summary())
    assert agreement.holds(), agreement.summary()


def test_a_wrong_kv_scale_fails_the_agreement(sharp_kv_models):
    """The criterion above catches a cache that misapplies its scales: k_scale and v_scale 16 times
    too small saturate e4m3's larger K and V and move the logits by 10% or more of their spread
    (measured 17.6% mean), and the first tokens off the float cache's on 2 of 16 prompts."""
    agreement = Agreement(first_logits(sharp_kv_models.broken, "fp8_e4m3"), first_logits(sharp_kv_models.path, "auto"))
    print(agreement.summary())
    assert agreement.noise.min() > 3 * MAX_NOISE
    assert agreement.agreeing < MIN_AGREEING and not agreement.holds()


@pytest.mark.parametrize("flag, quantization", [("fp8_e5m2", None), ("fp8_e4m3", "fp8")])
def test_engine_serves_fp8_kv_with_its_runners_first_tokens(sharp_kv_models, flag, quantization):
    """Through sglang.Engine (the scheduler in its own process, reading the scales there): the first
    tokens the runner gives above, with the cache's dtype reported and no slot leaked."""
    path = sharp_kv_models.path
    engine = sglang.Engine(
        model_path=path,
        dtype="float32",
        device="cpu",
        log_level="warning",
        kv_cache_dtype=flag,
        quantization=quantization,
    )
    try:
        outs = engine.generate(input_ids=TOKEN_PROMPTS, sampling_params=GREEDY_FIRST)
        assert engine.get_server_info()["kv_cache_dtype"] == flag
        assert_engine_kv_accounting(engine)
    finally:
        engine.shutdown()
    want = first_logits(path, flag, quantization).argmax(dim=-1).tolist()
    assert [out["output_ids"][0] for out in outs] == want


def test_fp8_kv_doubles_the_tokens_of_a_bf16_cache_in_the_same_memory(tiny_model_paths, monkeypatch, caplog):
    """A bfloat16 model on the CPU, whose pool gets a fixed budget of bytes (on CUDA: what memory
    is free); the pool sizes itself from the bytes of a token, as get_server_info reports."""
    per_token_bf16 = MHATokenToKVPool.bytes_per_token(torch.bfloat16, KV_HEADS, HEAD_DIM, 3)
    monkeypatch.setattr(model_runner_module, "CPU_KV_BUDGET_BYTES", 1000 * per_token_bf16)
    tokens = {}
    for flag in ("auto", "fp8_e4m3", "fp8_e5m2"):
        with caplog.at_level(logging.INFO):
            rank = OneRank(
                model_path=tiny_model_paths["llama"],
                dtype="bfloat16",
                device="cpu",
                log_level="warning",
                kv_cache_dtype=flag,
                disable_overlap_schedule=True,
            )
        tokens[flag] = rank.scheduler.model_info()["max_total_num_tokens"]  # get_server_info's field
        del rank
    assert tokens == {"auto": 1000, "fp8_e4m3": 2000, "fp8_e5m2": 2000}
    assert "KV cache: 2000 tokens" in caplog.text and "float8_e4m3fn" in caplog.text


def test_speculative_decoding_over_an_fp8_target_cache_is_its_plain_decoding():
    """Greedy, float32 activations, the demo pair (whose draft is accepted: a random draft's chains
    are all rejected, and a verify pass whose tokens are kept is what this checks). The draft's own
    KV stays float32; verification reads the target's FP8 cache as plain decoding does."""
    common = dict(
        model_path=demo.TARGET_PATH, dtype="float32", device="cpu", log_level="warning", kv_cache_dtype="fp8_e4m3"
    )
    prompts = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "for i in range(10):\n    print("]
    params = [{"temperature": 0, "max_new_tokens": n} for n in (32, 17, 24)]
    plain = OneRank(disable_overlap_schedule=True, **common).generate(prompts, params)
    spec_rank = OneRank(speculative_algorithm="EAGLE3", speculative_num_steps=3, **common)
    assert spec_rank.generate(prompts, params) == plain
    assert spec_rank.internal_state()["avg_spec_accept_length"] > 1.5
    worker = spec_rank.scheduler.tp_worker
    assert worker.model_runner.token_to_kv_pool.dtype == torch.float8_e4m3fn
    assert worker.draft_runner.token_to_kv_pool.dtype == torch.float32


# ---- the flag ------------------------------------------------------------------------------


def test_fp8_values_parse_and_a_bad_value_is_refused_naming_the_flag(capsys):
    for flag in ("fp8_e4m3", "fp8_e5m2", "auto"):
        assert prepare_server_args(["--kv-cache-dtype", flag]).kv_cache_dtype == flag
    with pytest.raises(SystemExit):
        prepare_server_args(["--kv-cache-dtype", "fp8"])
    err = capsys.readouterr().err
    assert "--kv-cache-dtype must be one of auto, fp8_e4m3, fp8_e5m2; got 'fp8'" in err
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        ServerArgs(kv_cache_dtype="int8", device="cpu")
