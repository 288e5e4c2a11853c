"""API key -> tenant and rate limits, from an in-memory copy of the active keys.

The copy reloads every ``refresh_s`` seconds (so a revocation or a changed limit takes effect
within that), and at most once a second on an unknown key (so a key created a moment ago works at
once, while a flood of bad keys costs the database one query a second).  Keys are required iff at
least one active key was ever created (revoked ones count), unless ``require`` pins it; with none
the gateway runs open as tenant ``default``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from clairvoyant.core.errors import Unauthenticated
from clairvoyant.gateway import metrics
from clairvoyant.gateway.keys import KeyGrant, KeyStore, hash_key
from clairvoyant.gateway.ratelimit import Limits, RateLimited, RateLimiter

logger = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
MISS_REFRESH_S = 1.0


def bearer_token(authorization: str | None) -> str | None:
    """The key in ``Authorization: Bearer <key>`` (None when absent or not a bearer header)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Authenticator:
    def __init__(
        self,
        store: KeyStore | None,
        require: bool | None = None,
        refresh_s: float = 5.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._require = require
        self._refresh_s = refresh_s
        self._now = now
        self._grants: dict[str, KeyGrant] = {}  # key_hash -> tenant and limits, active keys only
        self._any_key = False
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()
        self.limiter = RateLimiter(now)

    @property
    def required(self) -> bool:
        return self._require if self._require is not None else self._any_key

    async def start(self) -> None:
        await self.refresh()
        if not self.required:
            logger.warning(
                "no API keys exist: the gateway is OPEN and every request runs as tenant %r; "
                "create one with `python -m clairvoyant.gateway keys create --tenant <name>`",
                DEFAULT_TENANT,
            )
        else:
            logger.info("API keys required (%d active)", len(self._grants))

    async def refresh(self) -> None:
        if self._store is None:
            return
        async with self._lock:
            try:
                self._grants, self._any_key = await asyncio.to_thread(self._load, self._store)
            except Exception as exc:  # keep serving from the last copy while the database is down
                logger.warning("could not reload API keys: %s", exc)
            self._loaded_at = self._now()

    @staticmethod
    def _load(store: KeyStore) -> tuple[dict[str, KeyGrant], bool]:
        return store.grants(), store.any_key()

    async def authenticate(self, authorization: str | None) -> str:
        """The tenant for an ``Authorization`` header value.  Raises Unauthenticated."""
        if self._now() - self._loaded_at >= self._refresh_s:
            await self.refresh()
        token = bearer_token(authorization)
        key_hash = hash_key(token) if token else None
        if (
            key_hash is not None
            and key_hash not in self._grants
            and self._now() - self._loaded_at >= MISS_REFRESH_S
        ):
            await self.refresh()
        if key_hash is not None and key_hash in self._grants:
            return self._grants[key_hash].tenant
        if not self.required:
            return DEFAULT_TENANT
        if token is None:
            raise Unauthenticated(
                "missing API key: send it as 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        raise Unauthenticated("invalid API key", code="invalid_api_key")

    def admit(self, authorization: str | None, tokens: int, defaults: Limits) -> dict[str, str]:
        """Charge the caller of an authenticated request (call ``authenticate`` first) for one
        request of ``tokens`` tokens; returns its ``x-ratelimit-*`` headers.  Raises RateLimited.

        Each key has its own budget: its limits where it sets them, else ``defaults``.  Callers
        of an open gateway share the budget of tenant ``default``.
        """
        token = bearer_token(authorization)
        key_hash = hash_key(token) if token else None
        grant = self._grants.get(key_hash) if key_hash is not None else None
        if grant is None:
            subject, limits = f"tenant:{DEFAULT_TENANT}", defaults
        else:
            subject = f"key:{key_hash}"
            limits = Limits(
                defaults.requests_per_minute if grant.rpm is None else grant.rpm,
                defaults.tokens_per_minute if grant.tpm is None else grant.tpm,
            )
        try:
            return self.limiter.admit(subject, limits, tokens)
        except RateLimited as refusal:
            metrics.BUSY_REFUSALS.labels(f"rate_limit_{refusal.error_type}").inc()
            raise
