"""NVIDIA ModelOpt FP8 checkpoints (`hf_quant_config.json` with `quant_algo: FP8`, or config.json
`quant_method: modelopt`): e4m3 weights with a per-tensor `weight_scale`, activations quantized with
the checkpoint's per-tensor `input_scale`."""

from __future__ import annotations

from sglang.srt.layers.quantization import linear_method_for
from sglang.srt.layers.quantization.fp8 import Activations, Fp8LinearMethod, Fp8Scheme, WeightScales


class ModelOptFp8Config:
    def __init__(self, ignore: list[str]):
        self.method = Fp8LinearMethod(Fp8Scheme(WeightScales.TENSOR, Activations.STATIC))
        self.ignore = ignore

    @classmethod
    def from_config(cls, raw: dict) -> "ModelOptFp8Config":
        # hf_quant_config.json nests its settings under "quantization"; config.json may too.
        settings = {**raw, **raw["quantization"]} if isinstance(raw.get("quantization"), dict) else raw
        algo = settings.get("quant_algo")
        if algo != "FP8":
            raise ValueError(f"ModelOpt quant_algo {algo!r} is not served; served: FP8")
        return cls(list(settings.get("exclude_modules") or settings.get("ignore") or []))

    def linear_method(self, names: list[str]) -> Fp8LinearMethod | None:
        return linear_method_for(names, self.ignore, self.method, "ModelOpt exclude_modules")
