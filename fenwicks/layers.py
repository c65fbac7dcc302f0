"""Keras 3 building blocks. (Being built: building-blocks issue.)"""

import keras


class Sequential(keras.Sequential):
    """A Keras Sequential model (placeholder until the building-blocks issue lands)."""
