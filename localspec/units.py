"""How sizes and ages are written for people, in one place."""


def human_bytes(n: int | float | None, unknown: str = "?") -> str:
    """Decimal units, as download sizes are quoted: '1.12 GB', '98.4 MB'; `unknown` for None or 0."""
    if not n:
        return unknown
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def human_age(seconds: float) -> str:
    """'45 s', '12 min', '3 h', '5 days'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
