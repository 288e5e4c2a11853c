"""The soak benchmark's requests (``soak``): good ones that must be served, bad ones that must be
refused with a 4xx, and streams the client drops after the first chunk."""

from __future__ import annotations

import json
import random
from typing import Any, NamedTuple

import httpx


class Answer(NamedTuple):
    """What became of one request."""

    result: str  # good: served | failed; bad: refused | wrong; disconnect: dropped | failed
    request_id: str = ""  # from a 200 answer: its completion record must reach the stream
    error: str = ""  # what went wrong


MODEL = "llama-3.1-8b"  # emulated on an H100: ~7 ms a token, no CPU spent on a model

# Bodies the gateway must refuse with a 4xx; raw bytes, so broken JSON and lone surrogates get through.
BAD_BODIES: dict[str, bytes] = {
    "malformed JSON": b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "x"',
    "not an object": b'["model", "messages"]',
    "lone surrogate": b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "n=2": json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
    "negative max_tokens": json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -1}).encode(),
    "temperature as text": json.dumps({"model": MODEL, "prompt": "x", "temperature": "hot"}).encode(),
    "unknown model": json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}).encode(),
}


def _request_id(response_id: str) -> str:
    """``chatcmpl-<id>`` or ``cmpl-<id>`` -> ``<id>``, as the completion record names it."""
    return response_id.split("-", 1)[1]


class Traffic:
    """The requests: each method sends one and says what became of it; transport errors
    (``httpx.HTTPError``) and malformed replies (``ValueError``, ``KeyError``) are the caller's."""

    def __init__(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        self.client = client
        self.rng = rng

    async def good(self, client_index: int, n: int) -> Answer:
        """A chat or text completion, streamed or not, of 4 to 48 tokens."""
        chat = self.rng.random() < 0.7
        stream = self.rng.random() < 0.5
        max_tokens = self.rng.randint(4, 48)
        body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": f"client {client_index}, request {n}: go on"}]
            body["app_metadata"] = {"workflow_type_id": "soak", "workflow_id": f"c{client_index}-{n // 4}",
                                    "agent_id": f"agent-{n % 4}"}  # fmt: skip
        else:
            body["prompt"] = f"client {client_index}, request {n}:"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if not stream:
            response = await self.client.post(path, json=body)
            if response.status_code != 200:
                return Answer("failed", "", f"HTTP {response.status_code}: {response.text[:120]}")
            reply = response.json()
            if reply["usage"]["completion_tokens"] != max_tokens:
                return Answer("failed", "", f"{reply['usage']['completion_tokens']} of {max_tokens} tokens")
            return Answer("served", _request_id(reply["id"]))
        body["stream_options"] = {"include_usage": True}
        async with self.client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Answer("failed", "", f"HTTP {response.status_code}: {text[:120]}")
            response_id, tokens, done = "", None, False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Answer("failed", "", f"stream error: {str(chunk['error'])[:120]}")
                    response_id = response_id or chunk.get("id", "")
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
        if not done or tokens != max_tokens:
            return Answer("failed", "", f"stream ended early ({tokens} of {max_tokens} tokens, [DONE] {done})")
        return Answer("served", _request_id(response_id))

    async def bad(self) -> Answer:
        """One of ``BAD_BODIES``: refused with a 4xx and an OpenAI error object is right."""
        name = self.rng.choice(list(BAD_BODIES))
        path = "/v1/chat/completions" if b'"messages"' in BAD_BODIES[name] else "/v1/completions"
        response = await self.client.post(path, content=BAD_BODIES[name], headers={"content-type": "application/json"})
        try:
            error_object = isinstance(response.json().get("error"), dict)
        except (ValueError, AttributeError):
            error_object = False
        if 400 <= response.status_code < 500 and error_object:
            return Answer("refused")
        return Answer("wrong", "", f"{name}: HTTP {response.status_code}: {response.text[:120]}")

    async def disconnect(self) -> Answer:
        """A long stream the client drops after its first content chunk."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": "a long answer, please"}],
                "max_tokens": 400, "ignore_eos": True, "stream": True}  # fmt: skip
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return Answer("failed", "", f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        return Answer("dropped", _request_id(chunk["id"]))  # leaving the block closes it
        return Answer("failed", "", "the stream ended before its first token")
