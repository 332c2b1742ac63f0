"""Request errors that name the field at fault, so every front end can report it."""

from __future__ import annotations

import reprlib
from typing import Any, Optional

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def short_repr(value: Any) -> str:
    """A client's value as an error message shows it: bounded in length and depth, whatever was sent."""
    return _SHORT.repr(value)


# The status of a request aborted because a client asked (by going away, or by POST /abort_request):
# nginx's "client closed request". Not an error of the request: a caller still waiting gets what
# was generated, finished with type "abort".
ABORTED_BY_CLIENT = 499


class InvalidRequest(ValueError):
    """A request the engine will not run. `param` is the request field at fault (native
    names, e.g. `max_new_tokens`); front ends translate it to their own names."""

    def __init__(self, message: str, param: Optional[str] = None, status_code: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status_code = status_code
