"""What commands print: strict JSON, counts with the right plural, and the files skipped."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any


def json_text(value: Any) -> str:
    """Strict JSON: a NaN or infinity is an error, never an invalid document."""
    return json.dumps(value, allow_nan=False)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 epoch', '2 epochs' ('1 class', '3 classes' with `nouns`)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def report_skipped(skipped: Mapping[str, str], total: int, shown: int = 5) -> None:
    """One line on stderr naming the unreadable files a command skipped (the first `shown`,
    with why) and their count out of `total`; nothing when none was skipped."""
    if not skipped:
        return
    named = "; ".join(f"{path} ({why})" for path, why in list(skipped.items())[:shown])
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    print(
        f"vitkit: skipped {len(skipped)} of {plural(total, 'image')}, unreadable: {named}{more}",
        file=sys.stderr,
    )
