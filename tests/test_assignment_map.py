"""`fenwicks.train.tf.assignment_map`: TF1-style warm start by name, scopes and exact names."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from fenwicks.train.tf import assignment_map


def _checkpoint(prefix, tensors):
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    return prefix


def test_scope_and_exact_entries_load_what_they_name_and_refuse_missing_ones(tmp_path):
    dense = keras.layers.Dense(2, name="head")
    dense.build((None, 3))
    other = keras.layers.Dense(4, name="other")
    other.build((None, 3))
    rng = np.random.default_rng(0)
    saved = {"old/kernel": rng.normal(size=(3, 2)).astype(np.float32),
             "old/bias": rng.normal(size=(2,)).astype(np.float32),
             "other_b": rng.normal(size=(4,)).astype(np.float32)}
    source = _checkpoint(str(tmp_path / "model.ckpt"), saved)
    variables = dense.variables + other.variables
    report = assignment_map.warm_start(variables, source,
                                       {"old/": "head/", "other_b": "other/bias"})
    assert sorted(report["loaded"]) == ["head/bias", "head/kernel", "other/bias"]
    assert report["not_loaded"] == []
    np.testing.assert_array_equal(dense.kernel.numpy(), saved["old/kernel"])
    np.testing.assert_array_equal(other.bias.numpy(), saved["other_b"])
    # 'other_w' is not in the checkpoint: TF1's init_from_checkpoint raised ValueError
    # ("Tensor other_w is not found in ... checkpoint"); so does this, assigning nothing.
    fresh = keras.layers.Dense(2, name="fresh")
    fresh.build((None, 3))
    before = fresh.kernel.numpy()
    with pytest.raises(ValueError) as err:
        assignment_map.warm_start(fresh.variables + other.variables, source,
                                  {"old/kernel": "fresh/kernel", "other_w": "other/kernel"})
    assert isinstance(err.value, assignment_map.WarmStartError)
    assert str(err.value).startswith(
        f"the warm start from {source!r} maps 'other_w' to 'other/kernel', but the "
        "checkpoint holds no 'other_w' (its nearest: 'other_b')")
    assert "map 'other/kernel' to one of the checkpoint's names" in str(err.value)
    np.testing.assert_array_equal(fresh.kernel.numpy(), before)  # nothing assigned


def test_a_shape_mismatch_raises_as_tf1_init_from_checkpoint_did(tmp_path):
    """Issue 50, item 3: it was skipped silently; TF1 raised ("Shape of variable ...
    doesn't match with shape of tensor ...")."""
    other = keras.layers.Dense(4, name="other")
    other.build((None, 3))
    source = _checkpoint(str(tmp_path / "model.ckpt"),
                         {"other_w": np.ones((5, 4), np.float32)})  # other/kernel is [3, 4]
    with pytest.raises(assignment_map.WarmStartError) as err:
        assignment_map.warm_start(other.variables, source, {"other_w": "other/kernel"})
    assert "'other_w' (shape [5, 4] in the checkpoint) to 'other/kernel' (shape [3, 4] " \
        "here)" in str(err.value)
    np.testing.assert_array_equal(other.bias.numpy(), np.zeros(4))


def test_settings_map_picks_trainable_variables_by_pattern_and_renames():
    dense = keras.layers.Dense(2, name="enc")
    dense.build((None, 3))
    chosen = assignment_map.settings_map(dense.variables, "enc/k.*", {"enc/kernel": "x/w"})
    assert chosen == {"x/w": "enc/kernel"}


def test_a_map_that_loads_nothing_is_an_error_naming_both_sides(tmp_path):
    # BERT's get_assignment_map_from_checkpoint keys var.name, which Keras 3 shortens to
    # 'kernel': its map comes out empty. Loading nothing silently cost 0.995 -> 0.53.
    dense = keras.layers.Dense(2, name="head")
    dense.build((None, 3))
    source = _checkpoint(str(tmp_path / "model.ckpt"),
                         {"bert/head/kernel": np.ones((3, 2), np.float32)})
    with pytest.raises(assignment_map.WarmStartError) as err:
        assignment_map.warm_start(dense.variables, source, {})
    message = str(err.value)
    assert "an empty map" in message and "'bert/head/kernel'" in message
    assert "'head/kernel'" in message  # this model's names, to write the map from
    with pytest.raises(assignment_map.WarmStartError, match="'other/kernel -> x/y'"):
        assignment_map.warm_start(dense.variables, source, {"other/kernel": "x/y"})


def test_tf1_names_match_keras_paths_by_unambiguous_suffix(tmp_path):
    head = keras.layers.Dense(2, name="dense")
    head.build((None, 3))
    rng = np.random.default_rng(1)
    saved = {"bert/pooler/dense/kernel": rng.normal(size=(3, 2)).astype(np.float32),
             "bert/pooler/dense/bias": rng.normal(size=(2,)).astype(np.float32)}
    source = _checkpoint(str(tmp_path / "model.ckpt"), saved)
    # A map written from the checkpoint's own names: each ends with one Keras path.
    report = assignment_map.warm_start(head.variables, source, {k: k for k in saved})
    assert sorted(report["loaded"]) == ["dense/bias", "dense/kernel"]
    np.testing.assert_array_equal(head.kernel.numpy(), saved["bert/pooler/dense/kernel"])
    # Two layers' paths end alike: ambiguous, so the entry matches nothing.
    twin = keras.layers.Dense(2, name="dense")
    twin.build((None, 3))
    with pytest.raises(assignment_map.WarmStartError):
        assignment_map.warm_start(head.variables + twin.variables, source,
                                  {"bert/pooler/dense/kernel": "pooler/dense/kernel"})
