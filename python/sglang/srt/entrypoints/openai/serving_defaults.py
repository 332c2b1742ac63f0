"""`--sampling-defaults model`: the sampling parameters a model's generation_config.json
recommends, which /v1/chat/completions uses where a request leaves them unset (as upstream;
/v1/completions and /generate keep their fixed defaults). Read once per server."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import types
from collections.abc import Mapping
from typing import Any, Callable, Optional

from sglang.srt.sampling.sampling_params import MAX_REPETITION_PENALTY, MAX_TEMPERATURE

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"


def _number_in(low: float, high: float, low_open: bool = False) -> Callable[[Any], Optional[float]]:
    def check(value: Any) -> Optional[float]:
        if not _is_number(value) or not math.isfinite(value):
            return None
        inside = (low < value if low_open else low <= value) and value <= high
        return float(value) if inside else None

    return check


def _top_k(value: Any) -> Optional[int]:
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        return None
    return -1 if value == 0 else value  # transformers' 0 means "no top-k", which is our -1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# generation_config.json field -> its check: the value the engine takes, or None when out of range.
# Upstream's five (repetition_penalty is recommended by some models, Qwen2.5's 1.05).
_FIELDS: dict[str, Callable[[Any], Any]] = {
    "temperature": _number_in(0.0, MAX_TEMPERATURE),
    "top_p": _number_in(0.0, 1.0, low_open=True),
    "top_k": _top_k,
    "min_p": _number_in(0.0, 1.0),
    "repetition_penalty": _number_in(0.0, MAX_REPETITION_PENALTY, low_open=True),
}


def model_sampling_defaults(model_path: str, mode: str) -> Mapping[str, Any]:
    """The defaults a chat request takes for the fields it leaves unset: empty with
    `--sampling-defaults openai`, or where the model recommends none."""
    if mode != "model":
        return types.MappingProxyType({})
    return _read_once(os.path.abspath(model_path))


@functools.lru_cache(maxsize=None)
def _read_once(model_path: str) -> Mapping[str, Any]:
    recommended = _read_generation_config(model_path)
    defaults = {}
    for name, check in _FIELDS.items():
        if recommended.get(name) is None:
            continue
        value = check(recommended[name])
        if value is None:
            logger.warning(
                "%s recommends %s=%r, which is out of range; chat requests default to OpenAI's value instead",
                GENERATION_CONFIG,
                name,
                recommended[name],
            )
        else:
            defaults[name] = value
    if defaults:
        shown = ", ".join(f"{name}={value}" for name, value in defaults.items())
        logger.info(
            "chat requests that leave them unset sample with the model's %s defaults: %s (--sampling-defaults model)",
            GENERATION_CONFIG,
            shown,
        )
    return types.MappingProxyType(defaults)


def _read_generation_config(model_path: str) -> dict:
    # Read as JSON rather than through transformers' GenerationConfig: older transformers fill
    # fields the file leaves out with their own defaults (top_k=50), which the model never recommended.
    path = os.path.join(model_path, GENERATION_CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        logger.warning("%s cannot be read (%s); chat requests use OpenAI's sampling defaults", path, err)
        return {}
    return config if isinstance(config, dict) else {}
