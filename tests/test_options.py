"""`fenwicks.train.options.EstimatorConfig`: typed, frozen, validated once, each error
naming the argument as `get_tpu_estimator` spells it."""

import dataclasses
import inspect

import numpy as np
import pytest

import fenwicks as fw
from fenwicks.train.options import EstimatorConfig

GOOD = dict(steps_per_epoch=10, work_dir="/tmp/run/", train_batch_size=96,
            eval_batch_size=48, predict_batch_size=24, steps_per_loop=5,
            precision="float32", num_replicas=8)


def test_per_replica_batch_sizes_are_the_global_ones_over_the_replicas():
    config = EstimatorConfig(**GOOD)
    assert (config.train_batch_per_replica, config.eval_batch_per_replica,
            config.predict_batch_per_replica) == (12, 6, 3)  # 96/8, 48/8, 24/8
    assert config.work_dir == "/tmp/run"  # normalised once, here


def test_numpy_integers_become_ints_and_the_object_is_frozen():
    config = EstimatorConfig(**{**GOOD, "train_batch_size": np.int64(96),
                                "save_every_secs": 30})
    assert type(config.train_batch_size) is int and config.save_every_secs == 30.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps_per_loop = 1


@pytest.mark.parametrize("field, value, message", [
    ("train_batch_size", 100, r"trn_bs=100 must be divisible by the 8 replicas.*try 96 or 104"),
    ("eval_batch_size", 0, r"val_bs=0 must be a positive integer"),
    ("predict_batch_size", 12.0, r"pred_bs=12.0 must be a positive integer"),
    ("steps_per_epoch", -1, r"steps_per_epoch=-1 must be a positive integer"),
    ("steps_per_loop", 0, r"steps_per_loop=0 must be a positive integer"),
    ("keep_checkpoints", 0, r"keep_checkpoints=0 must be a positive integer"),
    ("save_every_loops", 0, r"save_every_loops=0 must be a positive integer.* or None"),
    ("save_every_secs", -5, r"save_every_secs=-5 must be a number >= 0 or None"),
    ("precision", "auto", r"precision='auto' must be one of"),
    ("jit_compile", "yes", r"jit_compile='yes' must be True or False"),
    ("verbose", 2, r"verbose=2 must be True or False"),
    ("seed", -1, r"seed=-1 must be an integer >= 0 or None"),
    ("work_dir", "", r"work_dir='' must be a local path"),
])
def test_every_out_of_range_option_is_an_error_naming_the_argument(field, value, message):
    with pytest.raises(ValueError, match=message):
        EstimatorConfig(**{**GOOD, field: value})


def test_the_options_after_the_original_positional_ones_are_keyword_only():
    parameters = inspect.signature(fw.train.get_tpu_estimator).parameters
    positional = [name for name, p in parameters.items()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    # The original Fenwicks passed these positionally (tutorials/PORTING.md).
    assert positional == ["steps_per_epoch", "model_func", "work_dir", "ws_dir", "ws_vars",
                          "trn_bs", "val_bs", "pred_bs"]
    with pytest.raises(TypeError):
        fw.train.get_tpu_estimator(2, lambda p: None, "/tmp/x", None, None, 8, 8, 8, 2)


def test_the_public_name_is_the_options_class():
    assert fw.train.EstimatorConfig is EstimatorConfig
