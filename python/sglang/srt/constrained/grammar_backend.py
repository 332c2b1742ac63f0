"""GrammarBackend: compiles request constraints with xgrammar on a thread pool in the scheduler
process, cached by (kind, text), and makes one matcher per request. A request whose grammar is
still compiling waits beside the queue; nobody else waits for it."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from typing import Optional

from sglang.srt.constrained.grammar import readable_error

logger = logging.getLogger(__name__)

# Compiled grammars kept (most recently asked for last); compiling a JSON schema takes milliseconds
# to a second, and agents send the same tool schemas again and again.
CACHE_SIZE = 256
# A matcher can be rolled back this many tokens: a speculative step's drafts (at most 16 + 1).
MAX_ROLLBACK_TOKENS = 32


class GrammarError(ValueError):
    """A constraint that xgrammar could not compile; the message names the field."""


class GrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int], threads: int = 2):
        import xgrammar

        self._xgrammar = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=sorted(stop_token_ids) or None)
        self.vocab_size = vocab_size
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads)
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="grammar")
        self.cache: dict[tuple[str, str], concurrent.futures.Future] = {}
        self.num_compiled = 0

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
        self.num_compiled += 1
        return compiled

    def matcher(self, compiled):
        return self._xgrammar.GrammarMatcher(compiled, max_rollback_tokens=MAX_ROLLBACK_TOKENS)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def make_grammar_backend(name: str, tokenizer_path: str, vocab_size: int,
                         stop_token_ids: set[int]) -> Optional[GrammarBackend]:
    if name == "none":
        return None
    from sglang.srt.hf_transformers_utils import get_tokenizer

    return GrammarBackend(get_tokenizer(tokenizer_path), vocab_size, stop_token_ids)


def schema_text(schema) -> str:
    """A JSON schema given as an object or as text, as text."""
    return schema if isinstance(schema, str) else json.dumps(schema)
