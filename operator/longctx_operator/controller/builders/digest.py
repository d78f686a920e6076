"""The content digest that rolls a pod when the config it reads changes."""

from __future__ import annotations

import hashlib


def content_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
