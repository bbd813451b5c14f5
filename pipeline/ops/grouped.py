"""Ops by group along time: climatologies, anomalies, resampling into periods, counts and spells."""
