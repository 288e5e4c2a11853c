"""``python -m clairvoyant.stack``: the whole local stack in the foreground (``make run``)."""

import sys

from clairvoyant.stack.launcher import main

sys.exit(main())
