"""The client-mistake exception, apart from the aiohttp answer it becomes (errors.py), so
the request parser and the routing core need no aiohttp."""

from __future__ import annotations


class RequestError(ValueError):
    """A client mistake, reported as a 400 (or `status`)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 is_closing: bool = False) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code
        self.headers = headers
        self.is_closing = is_closing  # close the connection after answering (body unread)
