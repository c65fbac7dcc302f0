"""The original Fenwicks's ``fw.anim`` names, forwarding to `fw.plt` (still images: the
original's animations needed a notebook HTML widget).

    fw.anim.show_input_func(eval_input_func, converter=fw.image.gray2rgb)
    fw.anim.show_image_files(paths, h_inch=1, w_inch=1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fenwicks import plt

__all__ = ["show_dataset", "show_image_files", "show_input_func"]


def show_input_func(input_func: Callable[[dict], Any], n_img: int = 16,
                    converter: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
    """`fw.plt.show_batch` of an input function's first `n_img` examples.

    Examples:
        >>> X, y = np.random.rand(16, 8, 8, 1), np.arange(16) % 2
        >>> eval_input_func = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                                   training=False)
        >>> fw.anim.show_input_func(eval_input_func, n_img=4, converter=fw.image.gray2rgb)
        <Figure size ... with 4 Axes>
    """
    return plt.show_batch(input_func, n=n_img, converter=converter, **kwargs)


def show_dataset(ds: Any, n_img: int = 16, converter: Callable[[Any], Any] | None = None,
                 **kwargs: Any) -> Any:
    """`fw.plt.show_batch` of a dataset's first `n_img` examples.

    Examples:
        >>> X, y = np.random.rand(16, 8, 8, 3), np.arange(16) % 2
        >>> fw.anim.show_dataset(tf.data.Dataset.from_tensor_slices((X, y)), n_img=9)
        <Figure size ... with 9 Axes>
    """
    return plt.show_batch(ds, n=n_img, converter=converter, **kwargs)


def show_image_files(paths: Sequence[str], n_img: int = 20, h_inch: float = 2.0,
                     w_inch: float = 2.0, **kwargs: Any) -> Any:
    """`fw.plt.show_image_files`: the first `n_img` image files as a grid.

    Examples:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> paths = [os.path.join(folder, f'{i}.png') for i in range(3)]
        >>> for path in paths:
        ...     keras.utils.save_img(path, np.random.rand(8, 8, 3))
        >>> fw.anim.show_image_files(paths, h_inch=1, w_inch=1)
        <Figure size ... with 3 Axes>
    """
    return plt.show_image_files(paths, n_img=n_img, h_inch=h_inch, w_inch=w_inch, **kwargs)


def __getattr__(name: str) -> object:
    raise AttributeError(
        f"fw.anim.{name} of the original Fenwicks is not here; fw.anim keeps "
        "show_input_func, show_dataset and show_image_files (still images, forwarding to "
        "fw.plt); for a transform, apply it and call fw.plt.show_batch((images, labels)) "
        "(tutorials/PORTING.md)")
