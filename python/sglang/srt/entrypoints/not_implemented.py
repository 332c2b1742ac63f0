"""Request fields that the OpenAI API (or SGLang's native API) defines and this server does not
implement yet. A request that sets one gets a 400 naming it, instead of an answer that silently
ignores what it asked for. Delete a field's entry here when it is implemented.

Fields nobody defines are still ignored, as upstream SGLang does: clients and SDK versions send
vendor fields of their own."""

from __future__ import annotations

from typing import Any, Callable

from sglang.srt.errors import InvalidRequest


def _no_tools(value: Any) -> bool:
    return value is None or value == []


# field -> whether its value asks for nothing (then it is accepted and changes nothing)
OPENAI_FIELDS: dict[str, Callable[[Any], bool]] = {
    "functions": _no_tools,
    "function_call": lambda v: v is None or v == "none",
}
# In /generate's sampling_params.
NATIVE_SAMPLING_FIELDS: dict[str, Callable[[Any], bool]] = {}


def reject_openai_fields(body: dict) -> None:
    _reject(body, OPENAI_FIELDS)


def reject_native_sampling_fields(sampling_params: Any) -> None:
    for params in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
        if isinstance(params, dict):
            _reject(params, NATIVE_SAMPLING_FIELDS)


def _reject(body: dict, fields: dict[str, Callable[[Any], bool]]) -> None:
    for name, asks_nothing in fields.items():
        if name in body and not asks_nothing(body[name]):
            raise InvalidRequest(
                f"'{name}' is not supported by this server yet; leave it out (the answer would not follow it)", name
            )
