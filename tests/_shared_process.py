"""Runs several tests' snippets in ONE process (see `shared_snippet` in tests/conftest.py).

    python -m tests._shared_process SNIPPETS.json     # prints {name: result} as JSON

Each snippet is a program that prints one JSON document as its last stdout line, as for
`run_json`. Here each runs in its own namespace with stdout captured; its result is
``{"json": <that document>}`` or ``{"error": <traceback>}``, so one failing snippet fails
only its own test. Between snippets the Keras dtype policy goes back to float32 and the
Keras session is cleared: what a snippet sets globally does not reach the next.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from typing import Any


def run(snippets: dict[str, str]) -> dict[str, Any]:
    import keras

    out: dict[str, Any] = {}
    for name, code in snippets.items():
        stdout = io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                exec(compile(code, f"<snippet {name}>", "exec"), {"__name__": "__snippet__"})
            out[name] = {"json": json.loads(stdout.getvalue().strip().splitlines()[-1])}
        except Exception:  # noqa: BLE001 - reported by that snippet's own test
            out[name] = {"error": traceback.format_exc() + stdout.getvalue()[-2000:]}
        finally:
            keras.config.set_dtype_policy("float32")
            keras.backend.clear_session()
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(run(json.load(f))))
