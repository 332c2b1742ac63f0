"""Upstream-style --speculative-adaptive-config files (dynamic speculation): batch-size buckets of candidate steps and
hysteresis margins, plus a few global settings."""

from __future__ import annotations

import json

# Upstream's default --speculative-adaptive-config (batch-size lower bound -> candidate steps),
# kept for reference in the docs. Our default candidate set is {0, 1, k_max} at every batch size:
# the cost model itself decides where each candidate stops paying off.
DEFAULT_ADAPTIVE_CONFIG = {"1": [1, 3, 5, 7], "8": [0, 1, 3], "32": [0, 1], "64": [0]}

# Global (non-bucket) keys of an adaptive config file, with their checks.
_GLOBAL_KEYS = ("ema_alpha", "warmup_batches", "update_interval")
_BUCKET_OBJECT_KEYS = ("candidate_steps", "up_hysteresis", "down_hysteresis")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_steps(path: str, key: str, steps) -> list[int]:
    where = f"--speculative-adaptive-config {path}: batch size {key!r}"
    if not isinstance(steps, list):
        raise ValueError(f"{where}: candidate steps must be a list of integers, got {steps!r}")
    if not steps:
        raise ValueError(f"{where}: the candidate step list is empty")
    for k in steps:
        if not _is_int(k) or k < 0:
            raise ValueError(f"{where}: candidate step {k!r} is not a non-negative integer")
    return sorted(set(steps))


def _parse_bucket(path: str, key: str, value) -> tuple[list[int], dict[str, float]]:
    """A bucket's value: a list of steps, or {"candidate_steps": [...], "up_hysteresis": x,
    "down_hysteresis": y} with the margins optional."""
    if not isinstance(value, dict):
        return _parse_steps(path, key, value), {}
    where = f"--speculative-adaptive-config {path}: batch size {key!r}"
    unknown = sorted(set(value) - set(_BUCKET_OBJECT_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (allowed: {list(_BUCKET_OBJECT_KEYS)})")
    if "candidate_steps" not in value:
        raise ValueError(f'{where}: the object needs "candidate_steps"')
    margins = {}
    for name in ("up_hysteresis", "down_hysteresis"):
        if name in value:
            margin = value[name]
            if not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin < 0:
                raise ValueError(f"{where}: {name} must be a number >= 0, got {margin!r}")
            margins[name.split("_")[0]] = float(margin)
    return _parse_steps(path, key, value["candidate_steps"]), margins


def _parse_global(path: str, key: str, value):
    where = f"--speculative-adaptive-config {path}: {key}"
    if key == "ema_alpha":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            raise ValueError(f"{where} must be a number in (0, 1], got {value!r}")
        return float(value)
    lowest = 0 if key == "warmup_batches" else 1
    if not _is_int(value) or value < lowest:
        raise ValueError(f"{where} must be an integer >= {lowest}, got {value!r}")
    return value


def parse_adaptive_config(path: str) -> dict:
    """Read an upstream-style --speculative-adaptive-config JSON file.

    Integer-string keys are batch-size lower bounds, each mapping to a list of candidate steps
    or to {"candidate_steps": [...], "up_hysteresis": x, "down_hysteresis": y}; the other keys
    are global settings (ema_alpha, warmup_batches, update_interval). The margins are relative
    objective gains needed to move to a larger ("up") or smaller ("down") k at that batch size. Returns
    {"candidates_by_bs": {bs: [k, ...]}, "hysteresis_by_bs": {bs: {"up": x, "down": y}} (only
    buckets that set a margin), "ema_alpha", "warmup_batches", "update_interval" (None when
    absent)}. ema_alpha feeds the estimator; warmup_batches and update_interval are validated and
    returned for the caller, since upstream configs carry them. Every problem is a ValueError
    naming the file and the offending key or value, because the file is read at start-up and a
    vague error there costs a restart."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--speculative-adaptive-config {path}: cannot read the file ({e})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-adaptive-config {path}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--speculative-adaptive-config {path}: expected a JSON object, got {type(raw).__name__}")
    out: dict = {"candidates_by_bs": {}, "hysteresis_by_bs": {}, **{key: None for key in _GLOBAL_KEYS}}
    for key, value in raw.items():
        if key in _GLOBAL_KEYS:
            out[key] = _parse_global(path, key, value)
            continue
        try:
            bs = int(key)
        except ValueError:
            try:
                float(key)
            except ValueError:
                raise ValueError(
                    f"--speculative-adaptive-config {path}: unknown key {key!r} (batch-size "
                    f"keys are positive integers; global keys: {list(_GLOBAL_KEYS)})"
                ) from None
            bs = None
        if bs is None or bs < 1:
            raise ValueError(f"--speculative-adaptive-config {path}: batch-size key {key!r} is not a positive integer")
        steps, margins = _parse_bucket(path, key, value)
        out["candidates_by_bs"][bs] = steps
        if margins:
            out["hysteresis_by_bs"][bs] = margins
    if not out["candidates_by_bs"]:
        raise ValueError(f'--speculative-adaptive-config {path}: no batch-size keys (e.g. "1": [0, 1, 3])')
    out["candidates_by_bs"] = dict(sorted(out["candidates_by_bs"].items()))
    return out
