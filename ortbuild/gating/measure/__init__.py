"""Measuring: percentiles, the sampling engine (looks, early stop, load-aware retry) and what it times."""
