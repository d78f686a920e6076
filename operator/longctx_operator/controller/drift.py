"""Whether a live object already holds what the operator would write."""

from __future__ import annotations

from typing import Any


def matches(desired: Any, live: Any) -> bool:
    """Whether every field the operator sets has that value in the live object."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(matches(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(matches(d, l) for d, l in zip(desired, live)))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired == live
    if isinstance(desired, (int, float)) and isinstance(live, str):
        return str(desired) == live
    return desired == live
