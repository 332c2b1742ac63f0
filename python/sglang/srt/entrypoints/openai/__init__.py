"""The OpenAI-compatible API: request/response models and the serving classes the HTTP
server routes /v1/completions and /v1/chat/completions to."""

from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

__all__ = ["OpenAIServingChat", "OpenAIServingCompletion"]
