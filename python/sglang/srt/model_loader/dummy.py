"""`--load-format dummy`: random weights in place of a checkpoint's, for measuring speed (which
depends on shapes, not on weight values) without writing or reading gigabytes of weights. Only
config.json (and a tokenizer) must exist."""

from __future__ import annotations

import torch
from torch import nn

DUMMY_SEED = 0
DUMMY_STD = 0.02  # as an initialised, untrained model: activations neither vanish nor blow up


@torch.no_grad()
def fill_dummy_weights(model: nn.Module, seed: int = DUMMY_SEED) -> None:
    """Every floating-point parameter drawn from N(0, DUMMY_STD), except norm weights (ones) and
    biases (zeros), the same on every run; then the model's own `after_dummy_weights()`, if it
    has one, sets up what a checkpoint would have carried besides weights (a draft's vocabulary
    map and own head). Parameters on the meta device (placeholders filled later) are skipped."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if param.device.type == "meta" or not param.is_floating_point() or hasattr(param, "scale_layout"):
            continue  # an FP8 layer's scales keep the ones they were made with
        module = name.rpartition(".")[0].rpartition(".")[2]  # "model.layers.0.input_layernorm"
        if name.endswith("bias"):
            param.zero_()
        elif "norm" in module:
            param.fill_(1.0)
        else:
            generator = generators.get(param.device)
            if generator is None:
                generator = generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            if param.element_size() == 1:  # FP8: drawn in float32 (no FP8 random kernels), then rounded
                param.copy_(torch.empty(param.shape, device=param.device).normal_(0.0, DUMMY_STD, generator=generator))
            else:
                param.normal_(0.0, DUMMY_STD, generator=generator)
    after = getattr(model, "after_dummy_weights", None)
    if after is not None:
        after()
