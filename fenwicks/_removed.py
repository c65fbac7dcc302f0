"""Names of the original Fenwicks (2019) that this one dropped or renamed: a module's
``__getattr__`` (PEP 562) turns an access to one into an error naming the replacement."""

from __future__ import annotations


def removed_error(module: str, name: str, replacements: dict[str, str]) -> AttributeError:
    """The AttributeError for ``module.name``: the replacement if the name was the
    original's, else Python's usual message."""
    if name in replacements:
        return AttributeError(
            f"{module}.{name} was part of the original Fenwicks and is not in this one; use "
            f"{replacements[name]} (see tutorials/PORTING.md)")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
