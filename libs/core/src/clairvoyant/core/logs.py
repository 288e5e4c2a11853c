"""Structured JSON logs for every service (one object per line on stderr), with secrets masked.

Masking: the password part of any ``scheme://user:password@host`` URL, and every value passed to
``register_secret`` (NATS passwords and tokens, nkeys seeds), is replaced by ``***`` in each line
the handler of ``setup_logging`` writes, tracebacks included.  Code should still log
``mask_url(url)``, not ``url``: the handler is the net, not the rule.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable
from typing import Any

MASK = "***"
# scheme://user:password@ -- the password runs up to the last '@' before the host part.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s/]*@")
# nats://TOKEN@host: NATS reads a user part without a password as a token.
_NATS_TOKEN = re.compile(r"(?P<head>\b(?:nats|tls|wss?)://)[^\s:/@]+@")
_secrets: set[str] = set()


def mask_url(text: str) -> str:
    """``text`` (a URL, a list of them, or a sentence naming some) with URL passwords and NATS
    tokens replaced by ``***``: ``nats://cv:***@nats:4222``."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + "@", text)
    return _NATS_TOKEN.sub(lambda m: m["head"] + MASK + "@", text)


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in a log line from now on (short values are ignored:
    masking every "a" would garble the logs and protect nothing)."""
    if value and len(value) >= 4:
        _secrets.add(value)


def register_secrets(values: Iterable[str | None]) -> None:
    for value in values:
        register_secret(value)


def redact(text: str) -> str:
    """``text`` with URL passwords and registered secrets masked."""
    text = mask_url(text)
    for secret in sorted(_secrets, key=len, reverse=True):  # longest first: one may contain another
        if secret in text:
            text = text.replace(secret, MASK)
    return text


_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                if isinstance(value, str):
                    value = redact(value)
                elif not isinstance(value, (int, float, bool, type(None))):
                    value = redact(str(value))
                entry[key] = value
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry)


class RedactingFormatter(logging.Formatter):
    """The plain-text format, with ``redact`` applied to the whole line."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(service: str, level: str = "INFO", json_logs: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(RedactingFormatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("nats", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
