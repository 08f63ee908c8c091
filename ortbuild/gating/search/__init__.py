"""Searches: precision bisection, build to the gates, session tuning, one protocol."""
