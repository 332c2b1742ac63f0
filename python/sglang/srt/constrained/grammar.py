"""A request's constraint as a key (kind, text), and the tokenizer-free syntax check the front end
runs so that a bad schema, regex or grammar is a 400 naming its field before it is queued."""

from __future__ import annotations

import json
import re
from typing import Optional

from sglang.srt.errors import InvalidRequest

# The sampling parameters that constrain a request, in the order they are looked at.
CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf")


def constraint_key(params) -> Optional[tuple[str, str]]:
    """(field, text) of the request's constraint, or None. At most one is allowed (checked by
    `check_constraint`)."""
    for field in CONSTRAINT_FIELDS:
        value = getattr(params, field, None)
        if value is not None:
            return field, value
    return None


def check_constraint(params) -> None:
    """Raises InvalidRequest naming the field when the constraint does not parse."""
    given = [field for field in CONSTRAINT_FIELDS if getattr(params, field, None) is not None]
    if len(given) > 1:
        raise InvalidRequest(
            f"at most one of json_schema, regex and ebnf may be given, got {', '.join(given)}", given[1]
        )
    if not given:
        return
    field = given[0]
    value = getattr(params, field)
    if field == "json_schema":
        _check_json(value)
    import xgrammar

    parse = {
        "json_schema": xgrammar.Grammar.from_json_schema,
        "regex": xgrammar.Grammar.from_regex,
        "ebnf": xgrammar.Grammar.from_ebnf,
    }[field]
    try:
        parse(value)
    except Exception as err:  # xgrammar raises RuntimeError with its C++ location first
        raise InvalidRequest(f"invalid {field}: {readable_error(err)}", field) from None


def _check_json(text: str) -> None:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequest(f"invalid json_schema: not JSON ({err})", "json_schema") from None
    except RecursionError:  # text nesting deeper than the request body may
        raise InvalidRequest("invalid json_schema: it nests arrays or objects too deeply", "json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("invalid json_schema: a schema must be a JSON object", "json_schema")


def readable_error(err: Exception) -> str:
    """xgrammar's message without its time stamp and C++ source location."""
    text = str(err).strip()
    return re.sub(r"^\[[\d:]+\]\s+\S+:\d+:\s*", "", text)
