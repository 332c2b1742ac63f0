"""compressed-tensors `float-quantized` checkpoints (RedHat / Neural Magic FP8 and FP8-dynamic): e4m3
weights with a per-tensor or per-channel `weight_scale`; activations quantized per token or per
tensor at run time, per tensor from the checkpoint's `input_scale`, or not at all (weight-only)."""

from __future__ import annotations

from sglang.srt.layers.quantization import linear_method_for
from sglang.srt.layers.quantization.fp8 import Activations, Fp8LinearMethod, Fp8Scheme, WeightScales

_WEIGHT_STRATEGIES = {"tensor": WeightScales.TENSOR, "channel": WeightScales.CHANNEL}
# (dynamic, strategy) of input_activations -> how activations are quantized.
_ACTIVATION_STRATEGIES = {
    (True, "token"): Activations.TOKEN,
    (True, "tensor"): Activations.TENSOR,
    (False, "tensor"): Activations.STATIC,
}
_WHERE = "quantization_config (compressed-tensors)"


def _refuse(what: str, value, served: str):
    raise ValueError(f"{_WHERE}: {what} {value!r} is not served; served: {served}")


def _check_fp8(args: dict, what: str) -> None:
    if (args.get("num_bits"), args.get("type")) != (8, "float"):
        _refuse(f"{what} num_bits/type", f"{args.get('num_bits')}/{args.get('type')}", "8/float (FP8)")
    if args.get("symmetric", True) is not True:
        _refuse(f"{what} symmetric", args.get("symmetric"), "true")


def _weight_scales(weights: dict) -> WeightScales:
    _check_fp8(weights, "weights")
    if weights.get("dynamic", False):
        _refuse("weights dynamic", True, "false")
    strategy = weights.get("strategy")
    if strategy not in _WEIGHT_STRATEGIES:
        _refuse("weights strategy", strategy, ", ".join(_WEIGHT_STRATEGIES))
    return _WEIGHT_STRATEGIES[strategy]


def _activations(inputs: dict | None) -> Activations:
    if inputs is None:
        return Activations.NONE
    _check_fp8(inputs, "input_activations")
    key = (bool(inputs.get("dynamic", False)), inputs.get("strategy"))
    if key not in _ACTIVATION_STRATEGIES:
        served = ", ".join(f"dynamic {d} with strategy {s}" for d, s in _ACTIVATION_STRATEGIES)
        _refuse("input_activations", f"dynamic {key[0]} with strategy {key[1]}", served)
    return _ACTIVATION_STRATEGIES[key]


class CompressedTensorsConfig:
    def __init__(self, scheme: Fp8Scheme, ignore: list[str]):
        self.method = Fp8LinearMethod(scheme)
        self.ignore = ignore

    @classmethod
    def from_config(cls, raw: dict) -> "CompressedTensorsConfig":
        if raw.get("format") != "float-quantized":
            _refuse("format", raw.get("format"), "float-quantized")
        groups = list((raw.get("config_groups") or {}).values())
        if len(groups) != 1:
            _refuse("number of config_groups", len(groups), "1")
        group = groups[0]
        if group.get("targets") != ["Linear"]:
            _refuse("config_groups targets", group.get("targets"), "['Linear']")
        scheme = Fp8Scheme(_weight_scales(group.get("weights") or {}), _activations(group.get("input_activations")))
        return cls(scheme, list(raw.get("ignore") or []))

    def linear_method(self, names: list[str]) -> Fp8LinearMethod | None:
        return linear_method_for(names, self.ignore, self.method, f"{_WHERE} ignore")
