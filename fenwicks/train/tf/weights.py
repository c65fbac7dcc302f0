"""The TensorFlow engine's checkpoints as `cross_engine` reads them on another engine:
found, recognised and read into the neutral form (`cross_engine.SavedWeights`: model
variables by Keras path, optimizer variables in ``optimizer.variables`` order, the step
and the input position), with TensorFlow only (no model, no strategy).

Keys are paths in TensorFlow's object graph, and the object graph saved inside the
checkpoint names each variable by its full name, which Keras sets to the variable's path
(``'mnist_net/conv_bn/conv2d/kernel'``). The optimizer's variables are saved by position
(``optimizer_state/NNNN``, `checkpoints.make_checkpoint`), as the optimizer lists them.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from fenwicks import _deadline
from fenwicks.train.checkpointing import step_of
from fenwicks.train.cross_engine import SavedWeights
from fenwicks.train.tf import checkpoints

NAME, TITLE = "tf", "TensorFlow engine"
_TF_STEP = "global_step/.ATTRIBUTES/VARIABLE_VALUE"  # as `checkpoints.make_checkpoint` saves it
_TF_INPUT = "input_steps/.ATTRIBUTES/VARIABLE_VALUE"  # the input position, in steps
_MODEL_KEYS = ("model/", "model_extra/")  # the model's keys in a TF-engine checkpoint
_OPTIMIZER = re.compile(r"^optimizer_state/(\d+)/")  # the optimizer's, by position


def latest(work_dir: str) -> str | None:
    """The TensorFlow engine's newest checkpoint in `work_dir`, from its state file or,
    if that is missing (a copied work_dir), by name."""
    found = checkpoints.latest(work_dir)
    if found is None:
        names = _deadline.run(tf.io.gfile.glob, f"{work_dir}/ckpt-*.index",
                              what="checkpoint listing", path=work_dir)
        prefixes = [n[: -len(".index")] for n in names]
        found = max(prefixes, key=step_of, default=None)
    return found


def all_checkpoints(work_dir: str) -> list[str]:
    """Every ``ckpt-<step>`` prefix in `work_dir` with an index, oldest first (the older
    ones a damaged newest falls back to)."""
    names = _deadline.run(tf.io.gfile.glob, f"{work_dir}/ckpt-*.index",
                          what="checkpoint listing", path=work_dir)
    prefixes = [n[: -len(".index")] for n in names]
    return sorted((p for p in prefixes if re.search(r"/ckpt-\d+$", p)), key=step_of)


def work_dir_of(source: str) -> str:
    """`source` as given: a work_dir or a ``ckpt-<step>`` prefix names itself."""
    return source.rstrip("/")


def is_checkpoint(source: str) -> bool:
    """Whether `source` is one of this engine's checkpoints (a ``ckpt-<step>`` prefix)."""
    return bool(_deadline.run(tf.io.gfile.exists, source + ".index", what="exists",
                              path=source))


def read(prefix: str) -> SavedWeights:
    """The model and optimizer variables, the step and the input position of checkpoint
    `prefix`."""
    # The object graph the checkpoint carries: its own record of which key holds which
    # variable, under the variable's full name (for a Keras variable, its path).
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    paths, arrays, optimizer = [], [], {}
    for node in graph.nodes:
        for attribute in node.attributes:
            key = attribute.checkpoint_key
            if key.startswith(_MODEL_KEYS):
                paths.append(attribute.full_name.split(":")[0])
                arrays.append(np.asarray(reader.get_tensor(key)))
            elif found := _OPTIMIZER.match(key):
                optimizer[int(found.group(1))] = (attribute.full_name.split(":")[0],
                                                  np.asarray(reader.get_tensor(key)))
    step = int(reader.get_tensor(_TF_STEP)) if reader.has_tensor(_TF_STEP) else 0
    position = int(reader.get_tensor(_TF_INPUT)) if reader.has_tensor(_TF_INPUT) else None
    in_order = sorted(optimizer)
    return SavedWeights(prefix, "tf", step, paths, arrays, in_model_order=False,
                        optimizer_paths=[optimizer[i][0] for i in in_order],
                        optimizer=[optimizer[i][1] for i in in_order] or None,
                        input_steps=position)
