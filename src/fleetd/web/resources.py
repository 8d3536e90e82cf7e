"""
Resource helpers for the listeners: one-line text refusals, JSON answers,
routers that answer 404 in plain text, and async rendering.

No twisted.web HTML page is ever produced: an unknown path, an unsupported
method and a failed request each get one short line.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest

log = Logger()

TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"


def textResponse(request: IRequest, code: int, line: str) -> bytes:
    """Set C{code} and a one-line text body on C{request}; return the body."""
    request.setResponseCode(code)
    request.setHeader(b"content-type", TEXT)
    request.setHeader(b"cache-control", b"no-store")
    return (line.rstrip("\n") + "\n").encode("utf-8")


def jsonResponse(request: IRequest, code: int, document: Any) -> bytes:
    """Set C{code} and a JSON body on C{request}; return the body."""
    request.setResponseCode(code)
    request.setHeader(b"content-type", JSON)
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(document, sort_keys=True).encode("utf-8") + b"\n"


class Refusal(resource.Resource):
    """A leaf that answers every method with one status and one line."""

    isLeaf = True

    def __init__(self, code: int, line: str) -> None:
        super().__init__()
        self.code = code
        self.line = line

    def render(self, request: IRequest) -> bytes:
        return textResponse(request, self.code, self.line)


class Endpoint(resource.Resource):
    """
    A resource whose unsupported methods get a one-line 405, not HTML.

    HEAD is served by C{render_GET} when there is no C{render_HEAD}.
    """

    def render(self, request: IRequest) -> Any:
        method = request.method.decode("ascii", "replace")
        allowed = {
            name[len("render_") :]
            for name in dir(self)
            if name.startswith("render_") and name[len("render_") :].isupper()
        }
        if "GET" not in allowed:
            allowed.discard("HEAD")  # resource.Resource's HEAD needs a GET
        handler = getattr(self, f"render_{method}", None) if method in allowed else None
        if handler is None:
            request.setHeader(b"allow", ", ".join(sorted(allowed)).encode("ascii"))
            return textResponse(request, http.NOT_ALLOWED, "method not allowed")
        return handler(request)


def notFound() -> Refusal:
    return Refusal(http.NOT_FOUND, "not found")


class Router(resource.Resource):
    """
    A resource whose unknown children and own path answer 404 in plain text.

    Children are registered with L{putChild}; everything else is a
    L{Refusal}, so no twisted.web HTML page is ever produced.
    """

    def __init__(self, index: resource.Resource | None = None) -> None:
        super().__init__()
        self._index = index

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and self._index is not None and not request.postpath:
            return self._index
        return notFound()

    def render(self, request: IRequest) -> bytes:
        return textResponse(request, http.NOT_FOUND, "not found")


Answer = Callable[[int, Any], bytes]  # (code, document) -> the body, set on the request
Refusals = Callable[[Exception], tuple[int, str] | None]


def answerAsync(
    request: Any,
    work: Callable[[], Awaitable[tuple[int, Any]]],
    answer: Answer,
    refuse: Callable[[int, str], bytes],
    refusal: Refusals | None = None,
    event: str = "admin.request.failed",
) -> int:
    """
    Run C{work}, then write C{answer(code, document)} of what it returns.

    An exception that C{refusal} maps to C{(code, line)} is C{refuse(code,
    line)}; any other is logged (C{event}) as a bug and answered with a 500
    C{"internal error"}. Nothing is written after the client went away.
    """
    gone: list[bool] = []
    request.notifyFinish().addErrback(lambda _: gone.append(True))

    async def run() -> None:
        try:
            code, document = await work()
            body = answer(code, document)
        except Exception as e:
            line = None if refusal is None else refusal(e)
            if line is None:
                log.failure(event, failure=Failure())
                line = (http.INTERNAL_SERVER_ERROR, "internal error")
            body = refuse(*line)
        if not gone:
            request.write(body)
            request.finish()

    Deferred.fromCoroutine(run())
    notDoneYet: int = server.NOT_DONE_YET
    return notDoneYet


def renderAsync(
    request: Any,
    work: Callable[[], Awaitable[tuple[int, Any]]],
    refusal: Refusals | None = None,
) -> int:
    """
    Run C{work} and write its C{(code, document)} as JSON; a refusal is
    its one line of text (L{answerAsync}).
    """
    return answerAsync(
        request,
        work,
        lambda code, document: jsonResponse(request, code, document),
        lambda code, line: textResponse(request, code, line),
        refusal,
    )
