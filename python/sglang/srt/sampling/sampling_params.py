"""Per-request sampling parameters: upstream SGLang's names and defaults, type checks for
values that arrive as JSON, and range checks before a request is scheduled."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from sglang.srt.errors import InvalidRequest, short_repr

# Below this temperature sampling is indistinguishable from argmax, and dividing by it
# would overflow the logits.
_GREEDY_TEMPERATURE = 1e-6
_MAX_SEED = 2**63  # seeds travel as int64 tensors


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 means the whole vocabulary
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_new_tokens: int = 0
    n: int = 1
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    # Penalties over the tokens this request has generated so far (not its prompt, as upstream
    # SGLang): logit -= frequency_penalty * count + presence_penalty * (count > 0); then, for a
    # token generated before, logit / repetition_penalty if positive, else logit * it.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # OpenAI's: token id (an int, or its decimal string as JSON keys are) -> bias in [-100, 100]
    # added to that token's logit before sampling, at every output position.
    logit_bias: dict | None = None
    # Never speculate for this request, even inside a speculative step of a batch (its drafts
    # are discarded and it takes the target's own next token): ignored without a draft.
    disable_speculative_decoding: bool = False
    # Benchmarks only, on a server run with SGLANG_SIMULATE_ACC_LEN: this request's simulated
    # accept length (tokens per verify of k_max drafts) instead of the server-wide one.
    simulated_accept_length: float | None = None
    # Constrained decoding (at most one): a JSON schema, a regular expression or an EBNF grammar
    # that the output must match (srt/constrained/).
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> SamplingParams:
        """Builds params from a request's `sampling_params` JSON object, checking types.

        A null value means "use the default", as OpenAI-style clients send nulls for
        fields they leave unset. Ranges are checked separately by `verify`."""
        if d is not None and not isinstance(d, dict):
            raise InvalidRequest(
                f"sampling_params must be an object of parameters, got {type(d).__name__}.", "sampling_params"
            )
        values = {}
        for name, value in (d or {}).items():
            if name not in _FIELD_TYPES:
                raise InvalidRequest(f"Unknown sampling parameter '{name}'.", name)
            if value is None:
                continue
            values[name] = _check_type(name, value)
        params = cls(**values)
        params.normalize_stop()
        return params

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.ebnf is not None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether any penalty is set (its logits then depend on its output so far)."""
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1

    def normalize_stop(self) -> list[str]:
        """Turns `stop` into a list of strings, in place, and returns it."""
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        return self.stop

    def verify(self, vocab_size: int | None = None) -> None:
        """Raises ValueError naming the first field outside its allowed range."""
        self._verify_lengths()
        self._verify_sampling()
        self._verify_stop_token_ids(vocab_size)
        self._verify_logit_bias(vocab_size)
        self._verify_penalties()
        self._verify_stop()

    def _verify_lengths(self) -> None:
        _require(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
        _require(
            0 <= self.min_new_tokens <= self.max_new_tokens,
            "min_new_tokens",
            f"must be in [0, max_new_tokens={self.max_new_tokens}]",
        )
        _require(1 <= self.n <= MAX_N, "n", f"must be in [1, {MAX_N}]")

    def _verify_sampling(self) -> None:
        # Each check states the allowed range, so NaN fails it too.
        _require(0 <= self.temperature <= MAX_TEMPERATURE, "temperature", f"must be in [0, {MAX_TEMPERATURE:g}]")
        _require(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _require(self.top_k == -1 or self.top_k >= 1, "top_k", "must be -1 (all) or >= 1")
        _require(0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        if self.sampling_seed is not None:
            _require(0 <= self.sampling_seed < _MAX_SEED, "sampling_seed", "must be in [0, 2**63)")

    def _verify_stop_token_ids(self, vocab_size: int | None) -> None:
        if vocab_size is None or not self.stop_token_ids:
            return
        for token_id in self.stop_token_ids:
            _require(
                0 <= token_id < vocab_size,
                "stop_token_ids",
                f"must be in [0, {vocab_size}), got {token_id}",
            )

    def _verify_logit_bias(self, vocab_size: int | None) -> None:
        for token_id, bias in self.token_biases().items():
            if vocab_size is not None:
                _require(
                    0 <= token_id < vocab_size, "logit_bias", f"token ids must be in [0, {vocab_size}), got {token_id}"
                )
            _require(
                -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,
                "logit_bias",
                f"values must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {bias:g} for token {token_id}",
            )

    def token_biases(self) -> dict[int, float]:
        """`logit_bias` with integer token ids and float biases (empty when unset); raises
        InvalidRequest naming logit_bias for a key that is not an integer or a non-number value."""
        return _parse_logit_bias(self.logit_bias)

    def _verify_penalties(self) -> None:
        # Upstream SGLang's ranges (OpenAI's for frequency and presence).
        for name in ("frequency_penalty", "presence_penalty"):
            _require(
                -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY,
                name,
                f"must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {getattr(self, name):g}",
            )
        _require(
            0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
            "repetition_penalty",
            f"must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = no penalty), got {self.repetition_penalty:g}",
        )

    def _verify_stop(self) -> None:
        for stop in self.stop or ():
            _require(len(stop) > 0, "stop", "must not contain an empty string")

    def verify_simulation(self, speculative: bool, simulating: bool) -> None:
        """simulated_accept_length: a benchmark's knob, meaningful on a speculative server run with
        SGLANG_SIMULATE_ACC_LEN (`simulating`: bench_hooks.BenchHooks.simulates_acceptance); there it
        must be in range, a speculative server without the simulation refuses it (the run would not
        measure what it asks), and a server without a draft ignores it (so one trace can be played
        against every server of a comparison)."""
        if self.simulated_accept_length is None or not speculative:
            return
        _require(1 <= self.simulated_accept_length <= 64, "simulated_accept_length", "must be in [1, 64]")
        if not simulating:
            raise InvalidRequest(
                "Sampling parameter 'simulated_accept_length' is for benchmarks: it needs a "
                "speculative server started with SGLANG_SIMULATE_ACC_LEN set.",
                "simulated_accept_length",
            )


# Most samples one request may ask for (each becomes a request of its own).
MAX_N = 64
# OpenAI's bound, on every route (beyond it sampling is noise anyway).
MAX_TEMPERATURE = 2.0

# OpenAI's bound on a logit bias (-100 bans a token, 100 all but forces it).
MAX_LOGIT_BIAS = 100

# Bounds of frequency_penalty and presence_penalty (OpenAI's), and of repetition_penalty (upstream's).
MAX_PENALTY = 2.0
MAX_REPETITION_PENALTY = 2.0


def _require(ok: bool, field: str, rule: str) -> None:
    if not ok:
        raise InvalidRequest(f"Sampling parameter '{field}' {rule}.", field)


def _parse_logit_bias(logit_bias: dict | None) -> dict[int, float]:
    biases = {}
    for key, value in (logit_bias or {}).items():
        token_id = key if _is_int(key) else _int_key(key)
        if token_id is None:
            raise InvalidRequest(
                f"Sampling parameter 'logit_bias' keys must be token ids (integers), got {short_repr(key)}.",
                "logit_bias",
            )
        if not (_is_number(value) and math.isfinite(value)):
            raise InvalidRequest(
                f"Sampling parameter 'logit_bias' values must be finite numbers, "
                f"got {short_repr(value)} for token {token_id}.",
                "logit_bias",
            )
        biases[token_id] = float(value)
    return biases


def _int_key(key: Any) -> int | None:
    """A string key holding one integer ("42", " 7", "-1"), else None ("+-5", "1e3", "4.0")."""
    text = key.strip() if isinstance(key, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 20:
        return int(text)
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_stop(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


# field -> (check, expected type in words, conversion)
_INT = (_is_int, "an integer", int)
_FLOAT = (lambda v: _is_number(v) and math.isfinite(v), "a finite number", float)
_BOOL = (lambda v: isinstance(v, bool), "a boolean", bool)
_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str, Callable[[Any], Any]]] = {
    "max_new_tokens": _INT,
    "temperature": _FLOAT,
    "top_p": _FLOAT,
    "top_k": _INT,
    "min_p": _FLOAT,
    "stop": (_is_stop, "a string or a list of strings", lambda v: v),
    "stop_token_ids": (_is_int_list, "a list of integers", list),
    "ignore_eos": _BOOL,
    "min_new_tokens": _INT,
    "n": _INT,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "no_stop_trim": _BOOL,
    "sampling_seed": _INT,
    "frequency_penalty": _FLOAT,
    "presence_penalty": _FLOAT,
    "repetition_penalty": _FLOAT,
    "logit_bias": (lambda v: isinstance(v, dict), "an object mapping token ids to biases", _parse_logit_bias),
    "disable_speculative_decoding": _BOOL,
    "simulated_accept_length": _FLOAT,
    "json_schema": (
        lambda v: isinstance(v, (str, dict)),
        "a JSON schema (text or object)",
        lambda v: v if isinstance(v, str) else json.dumps(v),
    ),
    "regex": (lambda v: isinstance(v, str), "a string", str),
    "ebnf": (lambda v: isinstance(v, str), "a string", str),
}
assert set(_FIELD_TYPES) == {f.name for f in dataclasses.fields(SamplingParams)}


def _check_type(name: str, value: Any) -> Any:
    check, expected, convert = _FIELD_TYPES[name]
    if not check(value):
        shown = short_repr(value)
        raise InvalidRequest(
            f"Sampling parameter '{name}' must be {expected}, got {type(value).__name__} {shown}.", name
        )
    return convert(value)
