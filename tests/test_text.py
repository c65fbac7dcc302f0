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


def test_first_line_skips_keras_wrapper_and_terminal_codes():
    # Keras wraps an error raised inside a layer's call in a bold line of its own; the
    # cause is the line below (jax's check_tpu_ready quotes it: the shape that fails).
    err = ValueError("\x1b[1mException encountered when calling Dense.call().\x1b[0m\n\n"
                     "\x1b[1mgot bool[16,64]\x1b[0m\n\nArguments received by Dense.call()")
    assert first_line(err) == "got bool[16,64]"
    assert first_line(ValueError("Exception encountered when calling X.call()")) == \
        "ValueError"
