"""GrammarBackend: compiles request constraints with xgrammar on a thread pool in the scheduler
process, cached by (kind, text), and makes one matcher per request. A request whose grammar is
still compiling waits beside the queue; nobody else waits for it."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from typing import Optional

from sglang.srt.constrained.grammar import readable_error
from sglang.srt.constrained.reasoning_grammar import ReasoningGrammar, ThinkTokens

logger = logging.getLogger(__name__)

# Compiled grammars kept (most recently asked for last); compiling a JSON schema takes milliseconds
# to a second, and agents send the same tool schemas again and again.
CACHE_SIZE = 256


class GrammarError(ValueError):
    """A constraint that xgrammar could not compile; the message names the field."""


class GrammarBackend:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: set[int],
        threads: int = 2,
        reasoning_parser: Optional[str] = None,
    ):
        import xgrammar

        self._xgrammar = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids) or None
        )
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.json_text_mask = _json_text_mask(info, vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads)
        self.threads = threads
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="grammar")
        self.cache: dict[tuple[str, str], concurrent.futures.Future] = {}
        self.num_compiled = 0
        # With --reasoning-parser: a request that thinks is constrained from the end of its block on.
        self.think_tokens = None if reasoning_parser is None else ThinkTokens.of(tokenizer, reasoning_parser)

    def compile(self, key: tuple[str, str]) -> concurrent.futures.Future:
        """A future of the compiled grammar for key (field, text); the same one for the same key
        while it is cached. A failed compile is not cached."""
        future = self.cache.pop(key, None)
        if future is None or (future.done() and future.exception() is not None):
            future = self.pool.submit(self._compile, key)
        self.cache[key] = future  # most recent last
        while len(self.cache) > CACHE_SIZE:
            self.cache.pop(next(iter(self.cache)))
        return future

    def _compile(self, key: tuple[str, str]):
        field, text = key
        try:
            if field == "json_schema":
                compiled = self.compiler.compile_json_schema(text, any_whitespace=False, strict_mode=True)
            elif field == "regex":
                compiled = self.compiler.compile_regex(text)
            elif field == "ebnf":
                compiled = self.compiler.compile_grammar(text)
            else:
                raise GrammarError(f"unknown constraint {field!r}")
        except GrammarError:
            raise
        except Exception as err:
            raise GrammarError(f"invalid {field}: {readable_error(err)}") from None
        if not self._first_tokens_exist(compiled, field):
            raise GrammarError(f"invalid {field}: nothing matches it, so no answer could satisfy it")
        self.num_compiled += 1
        return compiled

    def _first_tokens_exist(self, compiled, field: str) -> bool:
        r"""Whether a request under this grammar could write anything at all: an empty language
        (the regex [^\s\S], the EBNF root ::= root) would otherwise give an empty answer that
        looks finished. For a JSON schema, ending at once is no answer either: JSON text is never
        empty (xgrammar reads {"anyOf": []} as the empty string)."""
        import torch

        bitmask = self._xgrammar.allocate_token_bitmask(1, self.vocab_size)
        self.matcher(compiled, field).fill_next_token_bitmask(bitmask, 0)
        allowed = (bitmask[0].long().unsqueeze(-1) >> torch.arange(32)).bitwise_and(1).flatten()[: self.vocab_size]
        if field == "json_schema":
            allowed[[t for t in self.stop_token_ids if t < self.vocab_size]] = 0
        return bool(allowed.any())

    def matcher(self, compiled, field: str, thinks: bool = False):
        """A new matcher of the compiled grammar; `thinks`: the request reasons first (a chat
        request under --reasoning-parser), so the grammar starts after its reasoning block."""
        matcher = self._xgrammar.GrammarMatcher(compiled)  # rolls back any number of tokens
        if field == "json_schema":
            matcher = JsonMatcher(matcher, self.json_text_mask)
        return ReasoningGrammar(matcher, self.think_tokens) if thinks and self.think_tokens else matcher

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class JsonMatcher:
    """A JSON grammar's matcher that also forbids tokens with control characters. JSON text never
    holds one raw (inside strings they must be escaped, and the compact separators leave no
    whitespace outside them), but xgrammar's length-bounded strings let them through."""

    def __init__(self, matcher, allowed):
        self.matcher, self.allowed = matcher, allowed  # allowed: int32 bitmask row

    def fill_next_token_bitmask(self, bitmask, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)
        self.finish_row(bitmask, row)

    def finish_row(self, bitmask, row: int) -> None:
        """After the xgrammar matcher filled the row (here or in a batch fill)."""
        bitmask[row] &= self.allowed

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


def _json_text_mask(info, vocab_size: int):
    """int32 bitmask row of the tokens whose bytes hold no control character (< 0x20)."""
    import torch

    allowed = torch.ones(((vocab_size + 31) // 32) * 32, dtype=torch.bool)
    for token_id, raw in enumerate(info.decoded_vocab[:vocab_size]):
        if any(byte < 0x20 for byte in raw) and token_id not in info.stop_token_ids:
            allowed[token_id] = False
    weights = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64), torch.arange(32))
    words = (allowed.view(-1, 32).long() * weights).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def make_grammar_backend(
    name: str,
    tokenizer_path: str,
    vocab_size: int,
    stop_token_ids: set[int],
    reasoning_parser: Optional[str] = None,
    tokenizer_mode: str = "auto",
    trust_remote_code: bool = False,
) -> Optional[GrammarBackend]:
    """The tokenizer is loaded as the server loads it (--tokenizer-mode, --trust-remote-code), so
    the grammar's token strings are those of the tokens the model writes."""
    if name == "none":
        return None
    from sglang.srt.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_path, tokenizer_mode, trust_remote_code)
    return GrammarBackend(tokenizer, vocab_size, stop_token_ids, reasoning_parser=reasoning_parser)


def schema_text(schema) -> str:
    """A JSON schema given as an object or as text, as text."""
    return schema if isinstance(schema, str) else json.dumps(schema)
