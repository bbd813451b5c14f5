"""Field ops: coarsening, detrending, quantiles and multi-term formulas (see the ops below)."""
