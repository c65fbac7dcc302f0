"""Packaging for Fenwicks.

TensorFlow is deliberately *not* in ``install_requires``: Colab's GPU/CPU runtimes ship
``tensorflow``, Kaggle's TPU image ships ``tensorflow-cpu`` 2.20 (beside ``jax[tpu]``),
Cloud TPU VMs with Google's TensorFlow software versions ship ``tensorflow-tpu``, and pip
would happily install a second distribution over the one that is there (they share the
``tensorflow`` import name). Pick one with an extra on a machine that has none;
``import fenwicks`` says what to install if no TensorFlow is present.
"""

from setuptools import find_packages, setup

# The supported range, each end tested by tools/tf_matrix.sh: 2.20 is Kaggle's TPU pin (its
# tensorflow-cpu) and the newest tensorflow-tpu; 2.21 the newest release (no TPU build).
# Raise the ceiling after running the matrix on the new release, not before.
TF_RANGE = ">=2.20,<2.22"

setup(
    name="fenwicks",
    version="0.1.0",
    description="Train TensorFlow models on TPU, GPU or CPU with the same code.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["fenwicks", "fenwicks.*"]),
    install_requires=[
        "keras>=3.10,<4",  # 3.10: Optimizer.add_optimizer_variables; tests/test_optimizers.py
        "tensorflow-datasets>=4.9",
        # tensorflow-datasets 4.9 imports it (lazily, when a dataset builder is used) but
        # declares it only for Python < 3.9: without it tfds.load('mnist') fails at once.
        "importlib_resources>=5",
        "numpy>=1.24",
        "gcsfs>=2024.2",
        "tensorboard>=2.20",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        # Every engine's checkpoints (fenwicks/train/run_format.py); it brings JAX, which
        # the tf engine keeps on the CPU (fw.accel.keep_jax_off_accelerators).
        "orbax-checkpoint>=0.11",
        "tensorstore>=0.1.60",  # what orbax writes arrays with (checked at import fenwicks)
    ],
    extras_require={
        # At most one of these, on a machine without TensorFlow; none where one is installed
        # (Colab GPU/CPU, Kaggle, a TPU VM with tensorflow-tpu): see docs/platforms.md.
        "tensorflow": [f"tensorflow{TF_RANGE}"],
        "cpu": [f"tensorflow-cpu{TF_RANGE}"],
        "gpu": [f"tensorflow[and-cuda]{TF_RANGE}"],
        # A TPU VM without TensorFlow (Colab's TPU runtime: JAX and libtpu preinstalled).
        # The jax engine reaches the TPU through the JAX and libtpu that are there;
        # TensorFlow's CPU build runs tf.data. Not tensorflow-tpu: from PyPI it gets the
        # newest libtpu (JAX's; it asks only libtpu~=0.0.14), with which TensorFlow finds
        # no TPU, and it would replace the libtpu JAX needs. tools/platform_replicas.sh.
        "tpu": [f"tensorflow-cpu{TF_RANGE}", "jax>=0.7"],
        "demo": ["scikit-learn>=1.2"],
        # The tutorials on your own machine: jupyter lab tutorials/
        # ipywidgets: tqdm's progress bars in a notebook (without it: "IProgress not found").
        "notebooks": ["jupyterlab>=4", "ipykernel>=6", "ipywidgets>=8", "scikit-learn>=1.2"],
        # The documentation site (mkdocs.yml): mkdocs build --strict, mkdocs serve; the
        # tutorials are pages of it (mkdocs-jupyter).
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26",
                 "mkdocs-jupyter>=0.25"],
        # The JAX engine (KERAS_BACKEND=jax): jax for the devices (orbax-checkpoint, for
        # every engine's checkpoints, is a dependency of fenwicks itself).
        # On a TPU, JAX comes with the image (or pip install 'jax[tpu]').
        "jax": ["jax>=0.7"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.5",  # -n 2 --dist loadgroup (pyproject.toml's addopts)
            "scikit-learn>=1.2",
            "gcp-storage-emulator>=2024.8",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6",
            "ruff>=0.5",
            "py7zr>=0.20",  # fw.io.unzip of Kaggle's .7z archives (tests/test_io.py)
            "jax>=0.7",  # the blocks and the JAX engine on the CPU (KERAS_BACKEND=jax, cpu:8)
        ],
    },
    entry_points={"console_scripts": ["fenwicks=fenwicks.__main__:main"]},
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
