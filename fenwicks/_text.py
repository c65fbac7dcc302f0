"""Text helpers for Fenwicks' own messages.

A leaf module: it imports nothing of Fenwicks, so every layer can use it, the lowest ones
(`fw.accel`, `fw.io`, the storage deadlines) included.
"""

from __future__ import annotations

MESSAGE_LIMIT = 300  # characters of a cause quoted inside one of Fenwicks' messages


def first_line(err: BaseException | str, limit: int = MESSAGE_LIMIT) -> str:
    """The first non-blank line of an exception's message, to quote a cause in one line.

    TensorFlow's errors keep their own text in ``.message`` (``str(err)`` may add the
    graph node's context on later lines); other exceptions use ``str(err)``. Tracebacks
    and gRPC dumps run to many lines, so the line is cut at `limit` characters.

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
    """
    text = getattr(err, "message", None)
    text = text if isinstance(text, str) and text.strip() else str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(err).__name__
