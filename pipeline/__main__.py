"""``python -m pipeline``: the same as the ``pipeline`` command."""

import sys

from .cli import script

sys.exit(script())
