"""pipeline's settings live in dask's own config, under the key ``pipeline``.

One mechanism for all settings: YAML files in dask's config paths and ``DASK_PIPELINE__*``
environment variables, read by ``dask.config``. Defaults ship in ``pipeline.yaml``.
"""

from __future__ import annotations

import os

import dask.config
import yaml

_DEFAULTS = os.path.join(os.path.dirname(__file__), "pipeline.yaml")

with open(_DEFAULTS) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def get(key: str, default=None):
    """Read ``pipeline.<key>`` from dask's config."""
    return dask.config.get(f"pipeline.{key}", default=default)
