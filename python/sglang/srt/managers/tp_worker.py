"""TpModelWorker: runs a ScheduleBatch through the ModelRunner and samples its next tokens."""

from __future__ import annotations

import dataclasses

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs


@dataclasses.dataclass
class GenerationBatchResult:
    logits_output: LogitsProcessorOutput
    next_token_ids: torch.Tensor  # [bs] int64, on the device


class TpModelWorker:
    def __init__(self, server_args: ServerArgs, model_config: ModelConfig):
        self.device = server_args.device
        self.model_config = model_config
        self.model_runner = ModelRunner(model_config, server_args)

    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        forward_batch = batch.to_forward_batch(self.device)
        logits_output = self.model_runner.forward(forward_batch)
        sampling_info = SamplingBatchInfo.from_params(
            [req.sampling_params for req in batch.reqs], [req.seed for req in batch.reqs],
            self.model_config.vocab_size, self.device,
        )
        next_token_ids = self.model_runner.sample(
            logits_output.next_token_logits, sampling_info, batch.sampling_offsets(self.device)
        )
        return GenerationBatchResult(logits_output, next_token_ids)
