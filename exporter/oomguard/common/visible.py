"""`visible`: a string from an engine, a pod, a log or a remote answer, with the characters that act on a terminal or
break a line shown as escapes (`\\x1b`, `\\u2028`), so that it stays data wherever it is written.

Which characters: the C0 controls (ESC starts the terminal's sequences: colours, a window title, OSC 52's clipboard
write; CR, VT, FF and FS end a line for `str.splitlines()`), DEL, the C1 controls (CSI and OSC in one byte; NEL ends
a line), the line and paragraph separators U+2028 and U+2029 (lines to `splitlines()`, JavaScript and some
editors), and the bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), which reorder what
follows on screen ("Trojan Source"). Each is written as Python and JavaScript write it: `\\xHH` below U+0100,
`\\uHHHH` above. A leaf: it imports nothing of oomguard's.
"""

from __future__ import annotations

import re

ACTING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape(char: str) -> str:
    """One character's escape: `\\x1b`, `\\u2028`."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every character of ACTING written as its escape; the same string when it holds none."""
    if text.isprintable():  # none of ACTING is printable: most strings end here
        return text
    return ACTING.sub(lambda match: escape(match[0]), text)


__all__ = ["ACTING", "escape", "visible"]
