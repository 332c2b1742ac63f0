"""The EAGLE-3 draft model against the training-side reference (scripts/demo_models/draft_model.py)
on a checkpoint written by its `save_draft`: a DRAFT_EXTEND over a sequence is the reference's
step 0 at every position, DECODE chain steps are its later steps from the last anchor, batching
changes nothing, and the loader accepts both published name layouts and names what it rejects.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from safetensors.torch import load_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3, default_aux_layer_ids
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import make_cpu_runner
from sglang.test.tiny_models import make_tiny_model
from transformers import AutoConfig

DEMO_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "demo_models"))


def _import_draft_model():
    """The reference module, taken back out of sys.path and sys.modules afterwards."""
    sys.path.insert(0, DEMO_DIR)
    try:
        import draft_model

        return draft_model
    finally:
        sys.path.remove(DEMO_DIR)
        sys.modules.pop("draft_model", None)


reference = _import_draft_model()

NUM_TARGET_LAYERS = 4
AUX_LAYER_IDS = [0, 1, 2]
DRAFT_VOCAB_SIZE = 96
NUM_CHAIN_STEPS = 3
ATOL = 1e-4


@pytest.fixture(scope="module")
def target_runner(tmp_path_factory):
    # Default rope: the reference draft implements no rope scaling.
    path = make_tiny_model(
        str(tmp_path_factory.mktemp("target")), "llama", num_hidden_layers=NUM_TARGET_LAYERS, rope_scaling=None
    )
    return make_cpu_runner(path)


@pytest.fixture(scope="module")
def reference_draft(target_runner):
    target_config = target_runner.model_config.hf_config
    gen = torch.Generator().manual_seed(0)
    vocab_ids = torch.randperm(target_config.vocab_size, generator=gen)[:DRAFT_VOCAB_SIZE]
    draft = reference.Eagle3Draft(target_config, vocab_ids, AUX_LAYER_IDS)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            values = torch.randn(param.shape, generator=gen) * 0.1
            param.copy_(1 + 2 * values if name.endswith("norm.weight") else values)
            # save_draft writes bfloat16: keep exactly the values the engine will load.
            param.copy_(param.to(torch.bfloat16).float())
    return draft.eval()


@pytest.fixture(scope="module")
def draft_dir(reference_draft, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("draft"))
    reference.save_draft(reference_draft, path)
    return path


@pytest.fixture(scope="module")
def draft_runner(draft_dir, target_runner):
    args = ServerArgs(model_path=target_runner.model_config.path, dtype="float32", device="cpu", max_total_tokens=1024)
    runner = ModelRunner(ModelConfig.from_path(draft_dir, dtype="float32", device="cpu"), args, target=target_runner)
    return runner


@pytest.fixture
def driver(draft_runner):
    driver = DraftDriver(draft_runner)
    yield driver
    driver.release()


class DraftDriver:
    """Drives the draft runner as the speculative worker does: DRAFT_EXTEND over each request's
    new entries, then chain steps in DECODE mode, one new KV slot per request each."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.rows: list[int] = []
        self.kv_lens: list[int] = []
        self.slots: list[torch.Tensor] = []

    def extend(self, next_tokens: list[torch.Tensor], aux: list[torch.Tensor], return_all_logits=True):
        if not self.rows:
            self.rows = [self.runner.req_to_token_pool.alloc() for _ in next_tokens]
            self.kv_lens = [0] * len(next_tokens)
        lens = [len(tokens) for tokens in next_tokens]
        slots = self._alloc(sum(lens))
        for row, start, new_slots in zip(self.rows, self.kv_lens, slots.split(lens)):
            self.runner.req_to_token_pool.write(row, start, new_slots)
        positions = torch.cat([torch.arange(start, start + n) for start, n in zip(self.kv_lens, lens)])
        return self._forward(
            ForwardMode.DRAFT_EXTEND, torch.cat(next_tokens), positions, slots, lens, torch.cat(aux), return_all_logits
        )

    def chain_step(self, tokens: torch.Tensor, hidden: torch.Tensor):
        """Each request's chain entry goes to the next column; its RoPE position is that column."""
        slots = self._alloc(len(self.rows))
        self.runner.req_to_token_pool.write_scattered(self.rows, self.kv_lens, slots)
        positions = torch.tensor(self.kv_lens)
        return self._forward(ForwardMode.DECODE, tokens, positions, slots, [1] * len(self.rows), hidden, False)

    def _forward(self, mode, input_ids, positions, slots, lens, spec_hidden_states, return_all_logits):
        prefix_lens = self.kv_lens
        self.kv_lens = [kv + n for kv, n in zip(prefix_lens, lens)]
        batch = ForwardBatch(
            forward_mode=mode,
            batch_size=len(self.rows),
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=torch.tensor(self.rows),
            seq_lens=torch.tensor(self.kv_lens),
            out_cache_loc=slots,
            seq_lens_cpu=list(self.kv_lens),
            extend_seq_lens_cpu=lens,
            extend_prefix_lens_cpu=list(prefix_lens),
            return_all_logits=return_all_logits,
            spec_hidden_states=spec_hidden_states,
        )
        return self.runner.forward(batch)

    def _alloc(self, num_tokens: int) -> torch.Tensor:
        slots = self.runner.token_to_kv_pool_allocator.alloc(num_tokens)
        self.slots.append(slots)
        return slots

    def release(self):
        for slots in self.slots:
            self.runner.token_to_kv_pool_allocator.free(slots)
        for row in self.rows:
            self.runner.req_to_token_pool.free(row)


@torch.no_grad()
def reference_unroll(draft, embed, aux, next_tokens, num_steps):
    """draft_model.unroll (chain drafting with the draft's own guesses) for one sequence, also
    returning each step's output before the final norm: ([seq, draft_vocab], [seq, hidden]) per step."""
    positions = torch.arange(aux.shape[0])
    hidden, tokens = draft.fc(aux[None]), next_tokens[None]
    keys, values, steps = [], [], []
    for step in range(num_steps):
        q, k, v = draft.step_inputs(embed(tokens), hidden, positions + step)
        keys.append(k)
        values.append(v)
        hidden = draft.step_output(reference.chain_attention(q, keys, values), hidden)
        logits = draft.logits(hidden)
        steps.append((logits[0], hidden[0]))
        tokens = draft.to_target_ids(logits.argmax(-1))
    return steps


def random_sequence(seed: int, length: int, vocab_size: int, target_hidden: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen), torch.randn(length, 3 * target_hidden, generator=gen)


@pytest.fixture(scope="module")
def sequences(target_runner, reference_draft):
    """(next tokens, aux, reference steps) of two sequences of different lengths."""
    embed = target_runner.model.model.embed_tokens
    config = target_runner.model_config
    result = []
    for seed, length in ((1, 12), (2, 7)):
        tokens, aux = random_sequence(seed, length, config.vocab_size, config.hidden_size)
        result.append((tokens, aux, reference_unroll(reference_draft, embed, aux, tokens, 1 + NUM_CHAIN_STEPS)))
    return result


def test_reference_unroll_copy_matches_draft_model_unroll(target_runner, reference_draft, sequences):
    tokens, aux, steps = sequences[0]
    with torch.no_grad():
        expected = reference.unroll(
            reference_draft, target_runner.model.model.embed_tokens, aux[None], tokens[None], num_steps=len(steps)
        )
    for (logits, _), want in zip(steps, expected):
        assert torch.equal(logits, want[0])


def test_draft_extend_matches_reference_step_zero_at_every_position(driver, sequences):
    tokens, aux, steps = sequences[0]
    out = driver.extend([tokens], [aux], return_all_logits=True)
    logits, hidden = steps[0]
    assert out.next_token_logits.shape == (len(tokens), DRAFT_VOCAB_SIZE)
    assert out.next_token_logits.dtype == torch.float32
    torch.testing.assert_close(out.next_token_logits, logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden_states, hidden, atol=ATOL, rtol=0)


def test_draft_extend_over_a_cached_prefix_matches_one_pass(driver, sequences):
    tokens, aux, steps = sequences[0]
    split = 5
    driver.extend([tokens[:split]], [aux[:split]])
    out = driver.extend([tokens[split:]], [aux[split:]], return_all_logits=True)
    torch.testing.assert_close(out.next_token_logits, steps[0][0][split:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden_states, steps[0][1][split:], atol=ATOL, rtol=0)


def test_chain_steps_match_reference_unroll_from_the_last_anchor(driver, draft_runner, reference_draft, sequences):
    tokens, aux, steps = sequences[0]
    anchor = len(tokens) - 1
    hidden = driver.extend([tokens], [aux]).hidden_states[anchor:]
    for step in range(1, 1 + NUM_CHAIN_STEPS):
        guess = steps[step - 1][0][anchor].argmax()
        token = draft_runner.model.to_target_ids(guess[None])
        assert token.item() == reference_draft.to_target_ids(guess).item()
        out = driver.chain_step(token, hidden)
        logits, expected_hidden = steps[step]
        torch.testing.assert_close(out.next_token_logits[0], logits[anchor], atol=ATOL, rtol=0)
        torch.testing.assert_close(out.hidden_states[0], expected_hidden[anchor], atol=ATOL, rtol=0)
        hidden = out.hidden_states


def test_batch_of_two_lengths_matches_each_reference(driver, draft_runner, sequences):
    lens = [len(tokens) for tokens, _, _ in sequences]
    out = driver.extend([s[0] for s in sequences], [s[1] for s in sequences], return_all_logits=False)
    assert out.next_token_logits.shape == (len(sequences), DRAFT_VOCAB_SIZE)
    for i, (hidden, (_, _, steps)) in enumerate(zip(out.hidden_states.split(lens), sequences)):
        torch.testing.assert_close(out.next_token_logits[i], steps[0][0][-1], atol=ATOL, rtol=0)
        torch.testing.assert_close(hidden, steps[0][1], atol=ATOL, rtol=0)
    hidden = out.hidden_states[torch.tensor(lens).cumsum(0) - 1]
    for step in range(1, 1 + NUM_CHAIN_STEPS):
        guesses = torch.stack([steps[step - 1][0][-1].argmax() for _, _, steps in sequences])
        out = driver.chain_step(draft_runner.model.to_target_ids(guesses), hidden)
        for i, (_, _, steps) in enumerate(sequences):
            torch.testing.assert_close(out.next_token_logits[i], steps[step][0][-1], atol=ATOL, rtol=0)
            torch.testing.assert_close(out.hidden_states[i], steps[step][1][-1], atol=ATOL, rtol=0)
        hidden = out.hidden_states


def test_embedding_is_the_targets_tensor(draft_runner, target_runner):
    assert draft_runner.model.embed_tokens.weight is target_runner.model.model.embed_tokens.weight


def test_vocab_map_and_aux_layers_come_from_the_checkpoint(draft_runner, reference_draft):
    model = draft_runner.model
    assert model.draft_vocab_size == DRAFT_VOCAB_SIZE
    assert torch.equal(model.d2t, reference_draft.d2t)
    assert torch.equal(
        model.to_target_ids(torch.arange(DRAFT_VOCAB_SIZE)),
        reference_draft.to_target_ids(torch.arange(DRAFT_VOCAB_SIZE)),
    )
    assert model.aux_layer_ids == AUX_LAYER_IDS


def test_default_aux_layer_ids_are_low_middle_high():
    assert default_aux_layer_ids(32) == [1, 15, 28] == reference.default_aux_layer_ids(32)


# Loading from edited checkpoints, without a runner.


def draft_config(draft_dir, **overrides):
    config = AutoConfig.from_pretrained(draft_dir)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def load_draft(config, tensors: dict) -> LlamaForCausalLMEagle3:
    model = LlamaForCausalLMEagle3(config)
    with torch.no_grad():
        model.load_weights(iter(tensors.items()))
    return model


def test_layers_0_prefix_loads_the_same_model(draft_dir):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    renamed = {name.replace("midlayer.", "model.layers.0."): t for name, t in tensors.items()}
    assert renamed.keys() != tensors.keys()
    original, other = load_draft(draft_config(draft_dir), tensors), load_draft(draft_config(draft_dir), renamed)
    state, other_state = original.state_dict(), other.state_dict()
    assert state.keys() == other_state.keys()
    for name, value in state.items():
        assert torch.equal(value, other_state[name]), name


@pytest.mark.parametrize(
    "name, bad_shape",
    [
        ("midlayer.self_attn.k_proj.weight", (32, 64)),
        ("fc.weight", (64, 64)),
        ("lm_head.weight", (100, 64)),
        ("d2t", (DRAFT_VOCAB_SIZE + 1,)),
    ],
)
def test_weight_with_wrong_shape_fails_naming_it(draft_dir, name, bad_shape):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    tensors[name] = torch.zeros(bad_shape, dtype=tensors[name].dtype)
    with pytest.raises(ValueError, match=rf"{name}.*{bad_shape[0]}"):
        load_draft(draft_config(draft_dir), tensors)


def test_unknown_weight_fails_naming_it(draft_dir):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    tensors["midlayer.self_attn.q_norm.weight"] = torch.ones(16)
    with pytest.raises(ValueError, match="midlayer.self_attn.q_norm.weight"):
        load_draft(draft_config(draft_dir), tensors)


@pytest.mark.parametrize("name", ["midlayer.hidden_norm.weight", "midlayer.self_attn.v_proj.weight", "d2t"])
def test_missing_weight_fails_naming_it(draft_dir, name):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    del tensors[name]
    with pytest.raises(ValueError, match=name):
        load_draft(draft_config(draft_dir), tensors)


def test_t2d_disagreeing_with_d2t_fails(draft_dir):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    tensors["t2d"] = ~tensors["t2d"]
    with pytest.raises(ValueError, match="t2d"):
        load_draft(draft_config(draft_dir), tensors)


def test_running_before_sharing_the_embedding_fails_clearly(draft_dir):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    model = load_draft(draft_config(draft_dir), tensors)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND,
        batch_size=1,
        input_ids=torch.tensor([1, 2]),
        positions=torch.arange(2),
        req_pool_indices=torch.tensor([0]),
        seq_lens=torch.tensor([2]),
        out_cache_loc=torch.tensor([1, 2]),
        seq_lens_cpu=[2],
        extend_seq_lens_cpu=[2],
        extend_prefix_lens_cpu=[0],
        spec_hidden_states=torch.randn(2, model.fc.in_features),
    )
    with pytest.raises(RuntimeError, match="share_target_weights"):
        model(batch.input_ids, batch.positions, batch)


def test_checkpoint_embedding_is_kept_over_the_targets(draft_dir, target_runner):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    embedding = torch.randn(target_runner.model_config.vocab_size, 64)
    model = load_draft(draft_config(draft_dir), {**tensors, "model.embed_tokens.weight": embedding})
    model.share_target_weights(target_runner.model)
    assert torch.equal(model.embed_tokens.weight, embedding)


def test_full_vocab_draft_without_lm_head_or_d2t_shares_the_targets(draft_dir, target_runner):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    for name in ("lm_head.weight", "d2t", "t2d"):
        del tensors[name]
    vocab_size = target_runner.model_config.vocab_size
    model = load_draft(draft_config(draft_dir, draft_vocab_size=vocab_size), tensors)
    model.share_target_weights(target_runner.model)
    assert model.lm_head.weight is target_runner.model.lm_head.weight
    assert torch.equal(model.to_target_ids(torch.arange(vocab_size)), torch.arange(vocab_size))


def test_reduced_vocab_draft_without_lm_head_cannot_share(draft_dir, target_runner):
    tensors = load_file(os.path.join(draft_dir, "model.safetensors"))
    del tensors["lm_head.weight"]
    model = load_draft(draft_config(draft_dir), tensors)
    with pytest.raises(ValueError, match="lm_head"):
        model.share_target_weights(target_runner.model)


def test_config_without_eagle_config_leaves_aux_layers_to_the_worker(draft_dir):
    assert LlamaForCausalLMEagle3(draft_config(draft_dir, eagle_config=None)).aux_layer_ids is None
