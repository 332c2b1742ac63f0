"""Request errors that name the field at fault, so every front end can report it."""

from __future__ import annotations

from typing import Optional


class InvalidRequest(ValueError):
    """A request the engine will not run. `param` is the request field at fault (native
    names, e.g. `max_new_tokens`); front ends translate it to their own names."""

    def __init__(self, message: str, param: Optional[str] = None, status_code: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status_code = status_code
