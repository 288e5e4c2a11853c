"""``python -m clairvoyant.gateway``: serve (the default), or manage API keys."""

from clairvoyant.gateway.cli import app

if __name__ == "__main__":
    app(prog_name="python -m clairvoyant.gateway")
