"""What commands print: strict JSON, and counts with the right plural."""

from __future__ import annotations

import json
from typing import Any


def json_text(value: Any) -> str:
    """Strict JSON: a NaN or infinity is an error, never an invalid document."""
    return json.dumps(value, allow_nan=False)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 epoch', '2 epochs' ('1 class', '3 classes' with `nouns`)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
