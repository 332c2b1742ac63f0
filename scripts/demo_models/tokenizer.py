"""Byte-level BPE trained on the train split, saved as a Hugging Face fast tokenizer with a
chat template and an EOS token that also separates files in the token stream."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, chat_template=CHAT_TEMPLATE
    )


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """All files' tokens, each file followed by EOS, as one int32 array."""
    backend = tokenizer.backend_tokenizer
    eos = tokenizer.eos_token_id
    pieces = []
    for encoding in backend.encode_batch(texts, add_special_tokens=False):
        pieces += [np.asarray(encoding.ids, dtype=np.int32), np.asarray([eos], dtype=np.int32)]
    return np.concatenate(pieces)
