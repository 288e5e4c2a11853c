"""``python -m clairvoyant.gateway``: serve (the default), or manage API keys."""

from clairvoyant.core.processes import follow_parent
from clairvoyant.gateway.cli import app

if __name__ == "__main__":
    follow_parent()  # started by the stack launcher: stop when it dies
    app(prog_name="python -m clairvoyant.gateway")
