"""--log-requests: one log line as each request arrives and one as it finishes, with the detail of
--log-requests-level (0 ids and token counts, 1 also sampling parameters, 2 also input and output
cut to LOG_REQUESTS_TEXT_CHARS, 3 all of them)."""

from __future__ import annotations

import dataclasses
import logging

from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
LOG_REQUESTS_TEXT_CHARS = 2048
_DEFAULT_PARAMS = dataclasses.asdict(SamplingParams())


class RequestLogger:
    def __init__(self, level: int):
        self.level = level
        # Asked for by name: shown whatever --log-level (the handler passes what this logger lets through).
        logger.setLevel(logging.INFO)

    def received(self, obj: GenerateReqInput, reqs: list[TokenizedGenerateReqInput]) -> None:
        line = f"Receive: rid={_rids(reqs)}, prompt_tokens={[len(req.input_ids) for req in reqs]}"
        if self.level >= 1:
            line += f", sampling_params={[_given(req.sampling_params) for req in reqs]}"
        if self.level >= 2:
            prompt = obj.text if obj.text is not None else obj.input_ids
            line += f", input={self._cut(repr(prompt))}"
        logger.info(line)

    def finished(self, rid: str, text: str, meta: dict) -> None:
        line = (
            f"Finish: rid={rid!r}, finish_reason={meta.get('finish_reason')}, "
            f"prompt_tokens={meta.get('prompt_tokens')}, completion_tokens={meta.get('completion_tokens')}"
        )
        if self.level >= 2:
            line += f", output={self._cut(repr(text))}"
        logger.info(line)

    def _cut(self, text: str) -> str:
        if self.level >= 3 or len(text) <= LOG_REQUESTS_TEXT_CHARS:
            return text
        return f"{text[:LOG_REQUESTS_TEXT_CHARS]}... ({len(text)} characters)"


def _rids(reqs: list[TokenizedGenerateReqInput]) -> str:
    return repr(reqs[0].rid) if len(reqs) == 1 else repr([req.rid for req in reqs])


def _given(params: SamplingParams) -> dict:
    """The parameters that differ from the defaults."""
    return {key: value for key, value in dataclasses.asdict(params).items() if value != _DEFAULT_PARAMS.get(key)}
