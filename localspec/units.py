"""How sizes are written for people, in one place."""


def human_bytes(n: int | float | None, unknown: str = "?") -> str:
    """Decimal units, as download sizes are quoted: '1.12 GB', '98.4 MB'; `unknown` for None or 0."""
    if not n:
        return unknown
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
