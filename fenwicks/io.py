"""Storage: local and gs:// paths behave alike. (Being built: foundation issue.)"""

import os


def default_root() -> str:
    """The storage root `get_project_dirs(None, ...)` uses."""
    return os.path.expanduser("~/fenwicks")
