"""Autoscaler fixtures: a recording stand-in for an HTTP API (a Docker engine, a Kubernetes API
server), for tests that check the requests the client libraries send."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from clairvoyant.stack.natsserver import free_port


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any  # the JSON body, parsed; None when there was none


Answer = tuple[int, Any]  # status, JSON body (None: no body)
Route = Answer | Callable[[Recorded], Answer]


class RecordingServer:
    """Answers ``(method, path)`` from ``routes`` (404 otherwise) and records every request."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Route] = {}
        self.requests: list[Recorded] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Recorded(self.command, url.path, parse_qs(url.query),
                                   self.headers.get("Content-Type", ""), json.loads(raw) if raw else None)
                server.requests.append(request)
                route = server.routes.get((self.command, url.path))
                if route is None:
                    status, body = 404, {"kind": "Status", "message": f"{url.path} not found", "code": 404}
                else:
                    status, body = route(request) if callable(route) else route
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def api_server() -> Iterator[RecordingServer]:
    server = RecordingServer()
    try:
        yield server
    finally:
        server.close()


def unreachable_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there
