"""Benchmark requests: `random` token-id prompts (uniform over the tokenizer's vocabulary, or cut
from a ShareGPT file's prompts), conversations from a local ShareGPT-layout JSON / JSONL file, and
`generated-shared-prefix` groups of questions behind shared system prompts."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable


class DatasetError(ValueError):
    """A dataset that cannot give the requests asked for; the message says why."""


@dataclasses.dataclass
class BenchRequest:
    prompt: str | list[int]  # token ids (random) or text (ShareGPT)
    prompt_len: int  # tokens in `prompt` by the client's tokenizer
    output_len: int  # max_new_tokens; ignore_eos makes the server generate exactly this many
    # Benchmarks of speculation on random weights: the accept length this request asks a server
    # under SGLANG_SIMULATE_ACC_LEN to simulate (sampling parameter simulated_accept_length).
    simulated_accept_length: float | None = None


def sampleable_token_ids(tokenizer, vocab_size: int | None = None) -> list[int]:
    """Ids a random prompt may use: the tokenizer's vocabulary (capped by the model's, whose
    embedding may be smaller) without special tokens."""
    size = len(tokenizer) if vocab_size is None else min(len(tokenizer), vocab_size)
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(size) if i not in special]
    if not ids:
        raise DatasetError("the tokenizer has no ordinary tokens to sample prompts from")
    return ids


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """Lengths are drawn uniformly from [length * range_ratio, length] (at least 1)."""
    if length < 1:
        raise DatasetError(f"lengths must be at least 1; got {length}")
    if not 0.0 <= range_ratio <= 1.0:
        raise DatasetError(f"--random-range-ratio must be in [0, 1]; got {range_ratio}")
    return max(1, int(length * range_ratio)), length


class RandomDataset:
    """Prompts of sampled token ids; each call to `sample` draws fresh ones. The ids are drawn
    uniformly from `token_ids`, or, with `source_prompts` (token ids of a ShareGPT file's prompts,
    upstream's `random` with --dataset-path), cut from a random prompt repeated to the length.
    With `to_text` (chat messages, a chat template) the ids are sent as that text."""

    def __init__(
        self,
        token_ids: list[int],
        input_len: int,
        output_len: int,
        range_ratio: float,
        to_text: Callable[[list[int]], str] | None = None,
        source_prompts: list[list[int]] | None = None,
    ):
        self.token_ids, self.to_text, self.source_prompts = token_ids, to_text, source_prompts
        self.input_range = length_range(input_len, range_ratio)
        self.output_range = length_range(output_len, range_ratio)

    def sample(self, num: int, rng: random.Random) -> list[BenchRequest]:
        requests = []
        for _ in range(num):
            prompt_len = rng.randint(*self.input_range)
            if self.source_prompts:
                source = rng.choice(self.source_prompts)
                prompt = (source * -(-prompt_len // len(source)))[:prompt_len]
            else:
                prompt = [rng.choice(self.token_ids) for _ in range(prompt_len)]
            if self.to_text is not None:
                prompt = self.to_text(prompt)
            requests.append(BenchRequest(prompt, prompt_len, rng.randint(*self.output_range)))
        return requests


def sharegpt_prompt_ids(path: str, tokenizer) -> list[list[int]]:
    """Token ids of the first human turn of each conversation (the text upstream's `random`
    dataset cuts its prompts from)."""
    prompts = [
        tokenizer.encode(pair[0], add_special_tokens=False)
        for pair in map(_first_exchange, read_conversations(path))
        if pair is not None
    ]
    prompts = [ids for ids in prompts if ids]
    if not prompts:
        raise DatasetError(f"{path} has no conversation with a prompt and a reply")
    return prompts


def chat_template_text(tokenizer, text: str) -> str:
    """`text` as the user turn of the tokenizer's chat template, ready for generation, without
    the BOS token (the server adds its own), as upstream's --apply-chat-template does."""
    if not getattr(tokenizer, "chat_template", None):
        raise DatasetError("--apply-chat-template: the tokenizer has no chat template")
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return templated.replace(tokenizer.bos_token, "") if tokenizer.bos_token else templated


class SharedPrefixDataset:
    """upstream's `generated-shared-prefix`: `num_groups` system prompts of random text, each
    followed by `prompts_per_group` different questions (a blank line between them), all with the
    same output length, shuffled once. Every level of a sweep sends the same requests."""

    def __init__(
        self,
        tokenizer,
        token_ids: list[int],
        rng: random.Random,
        num_groups: int,
        prompts_per_group: int,
        system_prompt_len: int,
        question_len: int,
        output_len: int,
        wrap: Callable[[str], str] | None = None,
    ):
        def text(length: int) -> str:
            return tokenizer.decode([rng.choice(token_ids) for _ in range(length)])

        self.requests = []
        for _ in range(num_groups):
            system = text(system_prompt_len)
            for _ in range(prompts_per_group):
                prompt = f"{system}\n\n{text(question_len)}"
                prompt = wrap(prompt) if wrap else prompt
                prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False))
                self.requests.append(BenchRequest(prompt, prompt_len, output_len))
        rng.shuffle(self.requests)

    def sample(self, num: int, rng: random.Random) -> list[BenchRequest]:
        if num > len(self.requests):
            raise DatasetError(
                f"generated-shared-prefix has {len(self.requests)} prompts (--gsp-num-groups x "
                f"--gsp-prompts-per-group); lower --num-prompts to at most that"
            )
        return self.requests[:num]


class ShareGPTDataset:
    """The first human turn of each conversation as the prompt; the reply's token count (or
    `output_len`) as the output length. Rows are shuffled once with the seed."""

    def __init__(
        self,
        path: str,
        tokenizer,
        rng: random.Random,
        output_len: int | None = None,
        context_len: int | None = None,
        wrap: Callable[[str], str] | None = None,
    ):
        """`context_len`: drop conversations whose prompt and output lengths add up to more
        (upstream's --sharegpt-context-len); `wrap`: rewrites each prompt (a chat template)."""
        pairs = [pair for pair in map(_first_exchange, read_conversations(path)) if pair is not None]
        if not pairs:
            raise DatasetError(f"{path} has no conversation with a prompt and a reply")
        rng.shuffle(pairs)
        requests = [
            _to_request(tokenizer, wrap(prompt) if wrap else prompt, reply, output_len) for prompt, reply in pairs
        ]
        if context_len is not None:
            requests = [r for r in requests if r.prompt_len + r.output_len <= context_len]
            if not requests:
                raise DatasetError(f"no conversation of {path} fits --sharegpt-context-len {context_len}")
        self.requests = requests

    def sample(self, num: int, rng: random.Random) -> list[BenchRequest]:
        if num > len(self.requests):
            raise DatasetError(
                f"the dataset has {len(self.requests)} usable conversations; lower --num-prompts to at most that"
            )
        return self.requests[:num]


def read_conversations(path: str) -> list[dict]:
    """Rows of a JSON list or of a JSON-lines file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise DatasetError(f"cannot read the dataset {path}: {e.strerror}") from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = None
    if rows is None:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} is neither a JSON list nor JSON lines: {e}") from None
    if isinstance(rows, dict):
        rows = [rows]
    if not isinstance(rows, list):
        raise DatasetError(f"{path} must hold a list of conversations")
    return rows


def _first_exchange(row) -> tuple[str, str] | None:
    """(first human message, the reply to it); turns are {"from", "value"} as in ShareGPT, or
    {"role", "content"}."""
    turns = row.get("conversations", row.get("conversation")) if isinstance(row, dict) else None
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    texts = [turn.get("value", turn.get("content")) if isinstance(turn, dict) else None for turn in turns[:2]]
    if not all(isinstance(text, str) and text for text in texts):
        return None
    return texts[0], texts[1]


def _to_request(tokenizer, prompt: str, reply: str, output_len: int | None) -> BenchRequest:
    prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False))
    if output_len is None:
        output_len = max(1, len(tokenizer.encode(reply, add_special_tokens=False)))
    return BenchRequest(prompt, prompt_len, output_len)
