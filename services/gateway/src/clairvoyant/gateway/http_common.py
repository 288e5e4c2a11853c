"""What the gateway's HTTP routes share: reading a JSON body within limits, giving up on a client
that hung up, and the streaming headers (``http_api`` for OpenAI's routes, ``anthropic_api`` for
Anthropic's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import Request

from clairvoyant.core.errors import InvalidRequest, PayloadTooLarge
from clairvoyant.core.json_input import decode_json

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for "the client went away first"; only our metrics see it
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def read_json(request: Request, limit: int, max_depth: int) -> object:
    """The decoded JSON body; 400 for a wrong content type or bad JSON (see ``decode_json``), 413
    past ``limit`` bytes."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media != "application/json":
        raise InvalidRequest(
            f"Content-Type must be application/json, not {media!r}", code="invalid_content_type"
        )
    too_large = PayloadTooLarge(f"the request body exceeds {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for piece in request.stream():  # counted as it arrives: Content-Length may be absent or wrong
        body += piece
        if len(body) > limit:
            raise too_large
    return decode_json(bytes(body), max_depth)


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` unless the client hangs up first (then cancel it and return None).

    Starlette only notices a disconnect while streaming; a long non-streamed generation would
    otherwise keep its worker busy for a client that has gone.
    """

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()
