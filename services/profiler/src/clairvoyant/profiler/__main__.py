"""``python -m clairvoyant.profiler``: serve (the default), ``show`` a profile, ``evaluate`` offline."""

from clairvoyant.profiler.cli import app

if __name__ == "__main__":
    app(prog_name="python -m clairvoyant.profiler")
