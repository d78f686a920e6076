"""Kubernetes resource quantities ("48Gi", "512G", "1.5Ti", 1024) as integers."""

from __future__ import annotations

import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")

# The same grammar as the CRD's pattern for size fields (no milli units: these are bytes).
PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
# A size the planner may compute instead (schema.SizeOrAuto): the same grammar, or `auto`.
AUTO = "auto"
PATTERN_OR_AUTO = f"^({AUTO}|{PATTERN[1:-1]})$"

MiB = 2**20
GiB = 2**30


def parse_bytes(value: str | int, field: str = "quantity") -> int:
    """Parses a byte quantity; raises ValueError naming `field` when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a size such as 48Gi, got {value!r}")
    if isinstance(value, int):
        return value
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"{field}: {value!r} is not a size; write it like 48Gi, 512Gi or 1Ti")
    number, suffix = match.group(1), match.group(2) or ""
    scale = _BINARY.get(suffix) or _DECIMAL[suffix]
    if "." in number:
        whole, frac = number.split(".")
        return int(whole) * scale + (int(frac) * scale) // (10 ** len(frac))
    return int(number) * scale


def gib(value: float | None) -> float | None:
    """Bytes as GiB rounded to two decimals, for plans and messages (None stays None)."""
    return None if value is None else round(value / GiB, 2)


def format_bytes(value: int) -> str:
    """Renders bytes as the largest exact binary quantity (for Kubernetes manifests)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        scale = _BINARY[suffix]
        if value and value % scale == 0:
            return f"{value // scale}{suffix}"
    return str(value)
