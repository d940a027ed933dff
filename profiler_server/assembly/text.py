"""Text from hosts, made storable the same way on every backend.

PostgreSQL cannot hold NUL in text, no backend can encode a lone surrogate, and a name of
megabytes costs memory and storage in every request that uses it. Every string a host
sends passes through `storable` before it is kept, so what SQLite stores is what
PostgreSQL stores, and one bad string never fails a storage transaction.
"""

from __future__ import annotations

import re
from collections import Counter

from profiler_server.assembly import problems as P

REPLACEMENT = "\ufffd"  # stands for each character that cannot be stored
CUT = "…"  # ends a name cut to its limit
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str, limit: int, problems: Counter) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD, and cut to `limit`
    characters (the last one `…`); each repair is counted in `problems`."""
    if _UNSTORABLE.search(text) is not None:
        text = _UNSTORABLE.sub(REPLACEMENT, text)
        problems[P.UNSTORABLE_TEXT] += 1
    if len(text) > limit:
        text = text[: limit - 1] + CUT if limit > 1 else text[:limit]
        problems[P.LONG_NAME] += 1
    return text
