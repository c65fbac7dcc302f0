"""Colab helpers kept for ports of original-Fenwicks notebooks.

New code calls `fw.gcs.setup()`, which also covers Kaggle and plain machines. Nothing
of Colab is imported until a function here is called.
"""

from __future__ import annotations

from fenwicks import gcs
from fenwicks._removed import removed_error

__all__ = ["on_colab", "setup_gcs"]


def setup_gcs(project: str | None = None) -> str:
    """Alias of `fw.gcs.setup()`: authenticates for ``gs://`` paths and says how.

    Args:
        project: Google Cloud project. Defaults to the credentials' own project.

    Returns:
        Where the credentials came from (``'colab'`` on Colab).

    Examples:
        >>> fw.colab_utils.setup_gcs()
        fenwicks: Google Cloud Storage via Colab (google.colab.auth)
        'colab'
    """
    return gcs.setup(project)


def on_colab() -> bool:
    """True inside a Colab runtime (judged without importing ``google.colab``).

    Examples:
        >>> fw.colab_utils.on_colab()
        False
    """
    return gcs.environment() == "colab"


_REMOVED = {
    "setup_kaggle_from_gdrive": "the Kaggle CLI with your own key: upload kaggle.json "
                                "(google.colab.files.upload()) to ~/.kaggle/kaggle.json and "
                                "chmod 600 it; on Kaggle itself the data is under "
                                "/kaggle/input",
    "mount_google_drive": "google.colab.drive.mount('/content/drive')",
    "upload_files": "google.colab.files.upload()",
    "download_file": "google.colab.files.download(fn)",
}


def __getattr__(name: str) -> object:
    raise removed_error("fenwicks.colab_utils", name, _REMOVED)
