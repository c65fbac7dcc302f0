"""Text helpers for Fenwicks' own messages.

A leaf module: it imports nothing of Fenwicks, so every layer can use it, the lowest ones
(`fw.accel`, `fw.io`, the storage deadlines) included.
"""

from __future__ import annotations

import re

MESSAGE_LIMIT = 300  # characters of a cause quoted inside one of Fenwicks' messages
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours and bold, as Keras prints them
# Keras wraps an error raised inside a layer's call in this line (in bold), the original
# error's own line below it: that one names the cause (``got bool[16,64]``).
_KERAS_WRAPPER = "Exception encountered when calling"


def first_line(err: BaseException | str, limit: int = MESSAGE_LIMIT) -> str:
    """The first non-blank line of an exception's message, to quote a cause in one line.

    TensorFlow's errors keep their own text in ``.message`` (``str(err)`` may add the
    graph node's context on later lines); other exceptions use ``str(err)``. Tracebacks
    and gRPC dumps run to many lines, so the line is cut at `limit` characters. Terminal
    codes (ANSI bold) are removed, and Keras's wrapper line around an error raised inside
    a layer ("Exception encountered when calling ...") is skipped for the error's own.

    Args:
        err: the exception (or a message already made a string).
        limit: the most characters returned. Defaults to `MESSAGE_LIMIT` (300).

    Returns:
        The line, or the exception's type name when its message is empty.

    Examples:
        >>> first_line(OSError("disk full\\n  at write()"))
        'disk full'
        >>> first_line(KeyError())
        'KeyError'
        >>> first_line(ValueError("\\x1b[1mException encountered when calling Dense.call()."
        ...                       "\\x1b[0m\\n\\ngot bool[16,64]"))
        'got bool[16,64]'
    """
    text = getattr(err, "message", None)
    text = text if isinstance(text, str) and text.strip() else str(err)
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and _KERAS_WRAPPER not in line]
    return lines[0][:limit] if lines else type(err).__name__
