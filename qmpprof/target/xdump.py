"""The text of HMP's `x /Ngx` memory dump, parsed (for the hmp backend and for checking
the direct one against it)."""

from __future__ import annotations

import re

_HMP_LINE = re.compile(r"^([0-9a-f]+):((?: 0x[0-9a-f]{16})+)\s*$")


def parse_hmp_words(text: str, address: int) -> bytes:
    """The bytes of an `x /Ngx` listing that form one run from `address` (stops at a gap)."""
    data = bytearray()
    for line in text.splitlines():
        match = _HMP_LINE.match(line)
        if match is None or int(match.group(1), 16) != address + len(data):
            break
        for word in match.group(2).split():
            data += int(word, 16).to_bytes(8, "little")
    return bytes(data)
