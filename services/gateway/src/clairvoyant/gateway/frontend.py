"""The gateway's front: the parts both edges (``http_api``, ``grpc_api``) call, built from the
settings, with no transport type in them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.gateway.auth import Authenticator
from clairvoyant.gateway.clients import NoAnnotator, ProfilerClient, SchedulerClient, WorkerPool
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.keys import KeyStore
from clairvoyant.gateway.models import ModelCatalog
from clairvoyant.gateway.pipeline import Pipeline, RecordSink
from clairvoyant.gateway.ratelimit import Limits
from clairvoyant.gateway.request import GenerationRequest
from clairvoyant.gateway.response_store import ResponseStore

logger = logging.getLogger(__name__)


class GatewayFrontend:
    """Owns the clients, key store and pipeline.  ``start`` before serving, ``aclose`` after."""

    def __init__(
        self, settings: GatewaySettings, records: RecordSink, now: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.keys = KeyStore(settings.database_url)
        self.auth = Authenticator(self.keys, settings.require_api_key, settings.key_refresh_s)
        self.scheduler = SchedulerClient(settings.scheduler_address, settings.schedule_timeout_s)
        self.workers = WorkerPool()
        self.models = ModelCatalog(self.scheduler, settings.model_cache_s)
        self.annotator = (
            ProfilerClient(settings.profiler_address, settings.profiler_timeout_s)
            if settings.profiler_address
            else NoAnnotator()
        )
        self.pipeline = Pipeline(
            self.scheduler,
            self.workers,
            self.models,
            records,
            self.annotator,
            default_max_tokens=settings.default_max_tokens,
            now=now,
            record_token_ids=settings.gateway_record_token_ids,
        )
        # The Responses API's stored conversations (openai_responses); connects on first use.
        self.responses = ResponseStore(
            settings.responses_database_url(),
            ttl_s=settings.gateway_responses_ttl_s,
            timeout_s=settings.gateway_responses_timeout_s,
            now=now,
        )
        self.started_at = int(now())
        self._renewing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.auth.start()
        self._renewing = asyncio.create_task(
            self.pipeline.held.renew_forever(self.scheduler), name="gateway-lease-renewal"
        )
        if isinstance(self.annotator, ProfilerClient):
            self.annotator.connect()

    def admit(self, authorization: str | None, request: GenerationRequest) -> dict[str, str]:
        """Refuse at once what cannot run now, before the pipeline spends anything on it: a request
        for a model whose queue the scheduler has just reported full (QueueFull), or one over its
        key's rate limits (RateLimited, charging nothing).  Returns the key's ``x-ratelimit-*`` headers.

        A request is charged its prompt estimate plus its max_tokens (or the default max_tokens).
        """
        held = self.scheduler.full_queues.refusal(request.model)
        if held is not None:
            raise held
        settings = self.settings
        tokens = request.estimated_prompt_tokens() + (
            request.sampling.max_tokens or settings.default_max_tokens
        )
        defaults = Limits(settings.rate_limit_rpm, settings.rate_limit_tpm)
        return self.auth.admit(authorization, tokens, defaults)

    async def readiness(self) -> tuple[bool, str]:
        """(ready, why): ready once the scheduler answers and knows at least one worker."""
        try:
            models = await self.models.models()
        except ClairvoyantError as err:
            return False, err.message
        if not models:
            return False, "no worker is registered with the scheduler"
        return True, f"{sum(m.workers for m in models.values())} worker(s) serving {', '.join(models)}"

    async def aclose(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
        await self.pipeline.aclose()
        await self.scheduler.close()
        await self.workers.close()
        if isinstance(self.annotator, ProfilerClient):
            await self.annotator.close()
        await asyncio.to_thread(self.keys.close)
        await asyncio.to_thread(self.responses.close)
