"""sgkit's API on pipeline's backends: ``import pipeline.genomics as sg`` in place of ``import
sgkit as sg``. The ops live in :mod:`pipeline.ops.genomics`; this module only names them."""

from __future__ import annotations

from .ops.genomics import *  # noqa: F401,F403
from .ops.genomics import __all__  # noqa: F401
