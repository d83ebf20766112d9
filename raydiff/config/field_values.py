"""The error for a bad field value, and the comma-separated values several sections parse
(``'16,8'``, ``'1,2,2,2'``)."""

from __future__ import annotations

from typing import Any

from raydiff.errors import ConfigError


def invalid(section: str, name: str, value: Any, reason: str) -> ConfigError:
    """The error for ``section.name=value``, saying why it is invalid and what would be valid."""
    return ConfigError(section=section, field=name, value=value, reason=reason)


def parse_int_list(text: str, *, section: str, name: str) -> tuple[int, ...]:
    """Parse ``"16,8"`` into ``(16, 8)``; an empty string gives ``()``."""
    if text.strip() == "":
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise invalid(
            section, name, text, "expected comma-separated integers like '16,8'"
        ) from None


def channel_mult_of(
    text: str,
    *,
    image_size: int,
    table: dict[int, tuple[float, ...]],
    section: str,
    name: str,
) -> tuple[float, ...]:
    """Comma-separated multipliers (``"1,2,2"``), or ``table``'s entry for ``image_size`` when
    ``text`` is empty; errors name ``section.name``."""
    if text.strip():
        try:
            mult = tuple(float(m) for m in text.split(","))
        except ValueError:
            mult = ()
        if not mult or any(m <= 0 for m in mult):
            raise invalid(section, name, text, "expected positive numbers like '1,2,2,2'")
        return tuple(int(m) if m == int(m) else m for m in mult)
    if image_size not in table:
        sizes = ", ".join(str(k) for k in table)
        raise invalid(
            section,
            name,
            text,
            f"no default for image_size {image_size} (the table has {sizes}); set {name} "
            "explicitly, e.g. '1,2,2'",
        )
    return table[image_size]
