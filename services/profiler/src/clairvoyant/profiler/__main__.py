"""``python -m clairvoyant.profiler``: serve (the default), ``show`` a profile, ``evaluate`` offline."""

from clairvoyant.core.processes import follow_parent
from clairvoyant.profiler.cli import app

if __name__ == "__main__":
    follow_parent()  # started by the stack launcher: stop when it dies
    app(prog_name="python -m clairvoyant.profiler")
