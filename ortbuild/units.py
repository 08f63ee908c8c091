"""Human-readable units, one way everywhere (the build and test tables, the HTML report). Stdlib only."""

from __future__ import annotations

UNITS = ("B", "KB", "MB", "GB")


def human_size(n: float | None) -> str:
    """Bytes as B, KB, MB or GB, 1024-based, one decimal (whole bytes below 1 KB): `65.8 MB`; None: `-`."""
    if n is None:
        return "-"
    x = float(n)
    for unit in UNITS:
        if abs(round(x, 0 if unit == "B" else 1)) < 1024 or unit == UNITS[-1]:  # never `1024.0 KB`
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


def signed_size(n: float) -> str:
    """A change in bytes, with its sign: `+1.2 KB`, `-300 B`, `0 B`."""
    return ("+" if n > 0 else "-" if n < 0 else "") + human_size(abs(n))


def signed_percent(p: float) -> str:
    """A relative change: `+12%`, `-3.4%` (one decimal below 10%), never `-0%`."""
    text = f"{p:+.1f}%" if abs(p) < 10 else f"{p:+.0f}%"
    return text.replace("-0.0%", "+0.0%")
