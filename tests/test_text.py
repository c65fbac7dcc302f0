"""fenwicks._text.first_line: the one way Fenwicks quotes a cause inside its messages."""

import tensorflow as tf

from fenwicks._text import MESSAGE_LIMIT, first_line


def test_first_line_takes_the_first_non_blank_line_stripped():
    assert first_line(OSError("\n\n   disk full  \n  at write()\n")) == "disk full"


def test_first_line_prefers_tensorflows_own_message():
    err = tf.errors.NotFoundError(None, None, "gs://b/x not found\nnode context")
    assert first_line(err) == "gs://b/x not found"


def test_first_line_of_an_empty_message_is_the_type_name():
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("  \n ")) == "ValueError"


def test_first_line_is_cut_at_the_limit():
    assert first_line(ValueError("x" * 1000)) == "x" * MESSAGE_LIMIT
    assert first_line(ValueError("abcdef"), limit=3) == "abc"
