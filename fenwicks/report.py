"""`fw.info()`: one table of what Fenwicks will run on."""

from __future__ import annotations

import importlib
import sys


def format_bytes(size: int | None) -> str:
    """A byte count in binary units (``1.5 GiB``), or ``unknown`` for None."""
    if size is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def info_rows() -> list[tuple[str, str]]:
    """The (field, value) rows `info()` prints; detects the accelerator if needed."""
    import keras
    import tensorflow as tf

    from fenwicks import accel, io

    acc = accel.current()
    choice = accel.engine_choice()
    rows = [
        ("python", sys.version.split()[0]),
        ("tensorflow", tf.__version__),
        ("keras", keras.__version__),
    ]
    for library in choice.libraries:
        rows.append((library, importlib.import_module(library).__version__))
    rows += [
        ("engine", f"{acc.engine} (Keras on {keras.backend.backend()}; {choice.reason})"),
        ("accelerator", acc.kind + (" (simulated)" if acc.simulated else "")),
        ("chosen by", acc.reason),
        ("strategy", accel.distribution()),
        ("replicas", str(acc.num_replicas)),
        ("workers", str(acc.num_workers)),
        ("precision", acc.precision),
        ("remote (gs:// only)", "yes" if acc.is_remote else "no"),
    ]
    for i, (name, memory) in enumerate(zip(acc.devices, acc.memory, strict=False)):
        rows.append((f"device {i}", f"{name}, memory {format_bytes(memory)}"))
    try:
        root = io.default_root()
    except ValueError as err:  # a remote TPU without FENWICKS_BUCKET: say so, don't crash
        root = f"not set ({err})"
    rows.append(("storage root", root))
    # A TPU or GPU that is present but unusable: the same text as the warning at detection.
    rows += [("WARNING", note) for note in acc.warnings]
    return rows


def info() -> None:
    """Prints TensorFlow and Keras versions, the engine and why, devices, strategy,
    replicas, precision and the storage root, then a WARNING row for each TPU or GPU
    present but unusable (the original error, the fix and what was chosen instead).

    Examples:
        >>> fw.info()
        python               3.11.7
        tensorflow           2.21.0
        ...
    """
    rows = info_rows()
    width = max(len(field) for field, _ in rows) + 2
    for field, value in rows:
        print(f"{field:<{width}}{value}")
