"""OpenAI's Responses API: ``POST /v1/responses`` (docs/responses-api.md)."""

from __future__ import annotations

from fastapi import FastAPI

from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.frontend import GatewayFrontend


def register(app: FastAPI, settings: GatewaySettings, frontend: GatewayFrontend) -> None:
    """Add the Responses API's routes to ``app``."""
