"""Request bodies: read within --max-payload-size, parsed as JSON whatever the Content-Type
(curl -d sends form encoding), and validated into the route's pydantic model. Every way a body
can be wrong (too large, too deep, too many arrays, not JSON, lone surrogates, a mistyped field)
is an InvalidRequest naming the field, never a 5xx; and a hostile body costs the event loop
little (parsed without the cyclic garbage collector, which otherwise walks every list the
parser makes: 9 s instead of 1.5 s for 40 MB of small arrays)."""

from __future__ import annotations

import contextlib
import gc
import json
import re
from typing import Any, Callable, Optional

from fastapi import Request
from pydantic import BaseModel, ValidationError

from sglang.srt.errors import InvalidRequest

# Arrays and objects one body may open (counted as '[' and '{' bytes, strings included, so an
# overcount): no request needs millions (a batch of prompts is one array each), and parsing
# tens of millions would hold the event loop for seconds. A prompt with this many brackets has
# more tokens than any context holds.
MAX_JSON_CONTAINERS = 4_000_000


async def parse_json_body(
    raw_request: Request, model_cls: type[BaseModel], max_bytes: int, check: Optional[Callable[[dict], None]] = None
) -> BaseModel:
    """The body as `model_cls`; raises InvalidRequest naming the field at fault (413 past
    `max_bytes`). `check` sees the parsed object first."""
    data = await read_json_object(raw_request, max_bytes)
    if check is not None:
        check(data)
    try:
        with _no_gc():
            return model_cls.model_validate(data)
    except ValidationError as e:
        raise validation_error_to_invalid_request(e) from None


async def read_json_object(raw_request: Request, max_bytes: int) -> dict:
    raw = await read_body(raw_request, max_bytes)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_CONTAINERS:
        raise InvalidRequest(f"the request body opens more than {MAX_JSON_CONTAINERS} arrays and objects", "body")
    data = _parse(raw) if raw.strip() else None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object", "body")
    if _MAYBE_SURROGATE.search(raw):
        check_no_lone_surrogates(data)
    return data


def _parse(raw: bytes) -> Any:
    # The standard parser, not orjson: it stops at about 1000 levels of nesting (RecursionError),
    # so nothing downstream (a repr in an error message) meets a structure deeper than that.
    with _no_gc():
        try:
            return json.loads(raw)
        except RecursionError:
            raise InvalidRequest("the request body nests arrays or objects too deeply", "body") from None
        except ValueError as e:  # not JSON, not UTF-8, or an integer of thousands of digits
            raise InvalidRequest(f"the request body is not valid JSON: {_short(str(e))}", "body") from None


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def read_body(raw_request: Request, max_bytes: int) -> bytes:
    """The whole body, or InvalidRequest 413 past `max_bytes`. A body too large is still read
    to its end (and dropped), so that the client gets the 413 instead of a broken connection."""
    declared = raw_request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > max_bytes
    error = InvalidRequest(
        f"the request body is larger than the server takes ({max_bytes} bytes, --max-payload-size)",
        "body",
        status_code=413,
    )
    if too_large and raw_request.headers.get("expect", "").lower() == "100-continue":
        raise error  # the client waits for "100 Continue" before it sends the body: refused unsent
    chunks, size = [], 0
    async for chunk in raw_request.stream():
        size += len(chunk)
        too_large = too_large or size > max_bytes
        if not too_large:
            chunks.append(chunk)
    if too_large:
        raise error
    return b"".join(chunks)


# A lone surrogate reaches a parsed string only through a \uD800-\uDFFF escape or the raw bytes
# that would encode one (Python's JSON decoder lets those through); a body without either needs no walk.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_no_lone_surrogates(data: Any) -> None:
    """Raises InvalidRequest naming the first string (or key) that holds a lone surrogate: UTF-8
    cannot encode it, so neither the tokenizer nor the response could."""
    stack = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                where = ".".join(map(str, path)) or "body"
                raise InvalidRequest(
                    f"{where} holds a lone surrogate code point, which is not valid Unicode",
                    str(path[0]) if path else "body",
                )
        elif isinstance(value, dict):
            stack.extend((key, path) for key in value if isinstance(key, str))
            stack.extend((item, path + (key,)) for key, item in value.items() if isinstance(item, (str, list, dict)))
        elif isinstance(value, list):
            stack.extend((item, path + (i,)) for i, item in enumerate(value) if isinstance(item, (str, list, dict)))


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def validation_error_to_invalid_request(exc: ValidationError) -> InvalidRequest:
    err = exc.errors()[0]
    loc = [str(part) for part in err.get("loc", ()) if not isinstance(part, int)]
    # Union members show up in loc as type names; the field is the first element.
    param = loc[0] if loc else None
    where = ".".join(str(part) for part in err.get("loc", ())) or "body"
    return InvalidRequest(f"{where}: {err.get('msg', 'invalid value')}", param)
