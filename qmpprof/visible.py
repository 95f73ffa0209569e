"""Guest-controlled text made safe for a terminal: control characters shown, not obeyed.

Process names, symbol names and module names come from the guest or from files the
guest's owner wrote. Printed raw, an ESC can clear the screen or retitle the terminal
and a newline can forge a line of the summary. `visible` keeps every printable
character as it is and spells out the rest (`\\x1b`, `\\n`, `\\u202e`).
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """`text` with every control or format character (C0, DEL, C1, bidi overrides, ...)
    written as an escape sequence; unchanged (the same object) when there is none."""
    if text.isprintable():
        return text
    return "".join(_spelled(char) for char in text)


def _spelled(char: str) -> str:
    # Spaces other than U+0020 (no-break, thin, ...) are not "printable" to Python but
    # cannot move the cursor or hide text either.
    if char.isprintable() or unicodedata.category(char) == "Zs":
        return char
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
