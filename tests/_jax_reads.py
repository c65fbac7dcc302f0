"""Process helper of tests/test_jax_reads.py: the JAX engine's training input read several
steps at a time (`TrainBatches` with ``max_steps_per_read``) against one step a read, on
finite and endless inputs, printing what it saw as one JSON line.

    python -m tests._jax_reads
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from fenwicks.train.jax import inputs

REPLICAS, BATCH = 4, 3  # per-replica batches of 3 examples; a step takes 4 of them


def _dataset(num_batches: int | None) -> tf.data.Dataset:
    """Per-replica batches whose examples are their positions in the stream: example i
    of the stream has features [i, i] and label i."""
    examples = tf.data.Dataset.range(BATCH * num_batches if num_batches else 10**9)
    return examples.map(lambda i: (tf.fill([2], tf.cast(i, tf.float32)),
                                   tf.cast(i, tf.int32))).batch(BATCH, drop_remainder=True)


def _labels(batches: inputs.TrainBatches, sizes: list[int]) -> list[list[list[int]]]:
    """The labels of each global batch of each `take(size)`."""
    return [[np.asarray(labels).tolist() for _, labels in batches.take(size)]
            for size in sizes]


def main() -> dict:
    sizes = [1, 3, 2, 5, 4, 1]  # takes that straddle the reads of 4 steps
    out = {}
    # 23 per-replica batches: 5 whole steps and 3 batches over, which no step takes.
    for steps_per_read in (1, 4):
        batches = inputs.TrainBatches(_dataset(23), REPLICAS, steps_per_read)
        out[f"finite_{steps_per_read}"] = _labels(batches, sizes)
        out[f"finite_{steps_per_read}_features_shape"] = list(
            inputs.TrainBatches(_dataset(23), REPLICAS, steps_per_read).take(1)[0][0].shape)
        endless = inputs.TrainBatches(_dataset(None), REPLICAS, steps_per_read)
        out[f"endless_{steps_per_read}"] = _labels(endless, sizes)
    spec = _dataset(1).element_spec
    dynamic = tf.data.Dataset.range(5).map(lambda n: tf.zeros([3, n])).element_spec
    out["steps_per_read"] = {
        "static": inputs.steps_per_read(spec, REPLICAS, 10),
        "one_fits": inputs.steps_per_read(spec, REPLICAS, 10 ** 9),
        "dynamic": inputs.steps_per_read(dynamic, REPLICAS, 10),
    }
    out["read_bytes"] = inputs.READ_BYTES
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
