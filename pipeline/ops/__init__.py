"""Ops: ``pipeline.ops.<name>(data_array, **params)``; the same names are the steps of flows.

>>> import pipeline
>>> pipeline.ops.names()
['rolling_mean', 'standardized_anomaly', 'weighted_mean']
"""

from .registry import Op, all_ops, get, names, register
from .climate import rolling_mean, standardized_anomaly, weighted_mean

__all__ = ["Op", "all_ops", "get", "names", "register", "rolling_mean", "standardized_anomaly", "weighted_mean"]
