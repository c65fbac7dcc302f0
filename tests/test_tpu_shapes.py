"""TPU shapes without a TPU: v5e-1 (Colab, 1 replica), a 4-chip TPU VM and v5e-8 (Kaggle,
8 replicas) through `fw.accel`'s probe fakes, and what the estimator decides for each.

The accelerator comes out of the TPU code path of the tf engine's detector (a fake probe answers
``tpu_strategy('local')``); what runs in-process is only what needs no TPU: the
estimator's configuration, the eval/predict padding it applies, the storage root.
`tests/_tpu_fake.py` then trains, evaluates and predicts through a real strategy in a
subprocess (slow).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks import accel, io
from fenwicks.train import inputs
from fenwicks.train.tf import devices as tf_devices
from tests.conftest import run_module_json
from tests.test_accel import FakeProbe

# name -> replicas: each TPU chip of a v5e is one replica.
SHAPES = {"v5e-1": 1, "tpu-vm-4": 4, "v5e-8": 8}


def _tpu(replicas: int) -> accel.Accelerator:
    """A TPU of `replicas` chips as the tf engine detects it, its strategy a fake's."""
    acc = tf_devices.detect_devices(accel.Request(),
                                    FakeProbe(libtpu=True, tpu_replicas=replicas), env={})
    assert acc.kind == "tpu"
    return acc


def _model_func():
    opt_func = fw.train.adam_optimizer(lambda step: 1e-3)
    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=4, input_shape=(8, 8, 1)), opt_func)


@pytest.fixture
def on_tpu(accel_state):
    """Makes `fw.accel.current()` return a faked TPU of the given shape."""
    def use(name: str) -> accel.Accelerator:
        acc = _tpu(SHAPES[name])
        accel_state(acc)
        return acc
    return use


@pytest.mark.parametrize("name", SHAPES)
def test_the_tpu_code_path_decides_kind_precision_and_devices(name):
    acc = _tpu(SHAPES[name])
    n = SHAPES[name]
    assert (acc.kind, acc.num_replicas, acc.precision) == ("tpu", n, "bfloat16")
    assert acc.keras_policy == "mixed_bfloat16"
    assert acc.devices == tuple(f"TPU:{i}" for i in range(n))
    assert not acc.is_remote and not acc.simulated and acc.num_workers == 1
    assert acc.reason == ("auto-detection: a TPU on this machine answered (a TPU VM: libtpu "
                          "is installed)")


@pytest.mark.parametrize("name", SHAPES)
def test_estimator_choices_on_each_tpu_shape(name, on_tpu, tmp_path):
    on_tpu(name)
    n = SHAPES[name]
    est = fw.train.get_tpu_estimator(12, _model_func(), str(tmp_path), trn_bs=64, val_bs=200,
                                     pred_bs=40)
    config = est.config
    assert (config.precision, config.jit_compile) == ("bfloat16", True)
    assert config.steps_per_loop == 12  # one epoch per compiled call by default
    assert est.num_replicas == n
    # params['batch_size'] is per replica: 64 / n (64, 16, 8), as the input_fn sees it.
    for mode, global_batch, per_replica in [("train", 64, 64 // n), ("eval", 200, 200 // n),
                                            ("predict", 40, 40 // n)]:
        params = est.parts.inputs.params(mode, global_batch)
        assert (params["batch_size"], params["global_batch_size"],
                params["num_replicas"]) == (per_replica, global_batch, n)
        assert params["precision"] == "bfloat16"
    est.close()
    # Asking for float32 or no XLA is still the user's choice on a TPU.
    est = fw.train.get_tpu_estimator(12, _model_func(), str(tmp_path), trn_bs=64,
                                     steps_per_loop=3, precision="float32", jit_compile=False)
    assert (est.config.precision, est.config.jit_compile, est.config.steps_per_loop) == \
        ("float32", False, 3)
    est.close()


@pytest.mark.parametrize("name,trn_bs,ok", [
    ("v5e-1", 20, True),       # one replica: any batch size
    ("tpu-vm-4", 20, True),    # 5 per chip
    ("v5e-8", 20, False),      # 20 / 8 is not whole: refused before anything compiles
])
def test_batch_size_must_split_over_the_chips(name, trn_bs, ok, on_tpu, tmp_path):
    on_tpu(name)
    if ok:
        fw.train.get_tpu_estimator(5, _model_func(), str(tmp_path), trn_bs=trn_bs).close()
    else:
        with pytest.raises(ValueError, match="trn_bs=20"):
            fw.train.get_tpu_estimator(5, _model_func(), str(tmp_path), trn_bs=trn_bs)


def _padded(num_examples: int, batch_size: int, replicas: int):
    """The estimator's eval/predict padding (`inputs.pad_and_mask`) over `num_examples`."""
    ds = tf.data.Dataset.from_tensor_slices(np.arange(num_examples, dtype="float32")
                                            .reshape(-1, 1))
    ds = ds.batch(batch_size)  # a partial last batch, as evaluation input_fns give
    padded = inputs.pad_and_mask(ds, batch_size, replicas, "evaluation")
    return padded, list(padded.as_numpy_iterator())


@pytest.mark.parametrize("name,expected_batches", [
    # 10 examples in per-replica batches of 4: 4 + 4 + 2, then whole steps of R batches.
    ("v5e-1", 3),      # no filler batch on one replica: 3 steps
    ("tpu-vm-4", 4),   # one step of 4 batches (one filler)
    ("v5e-8", 8),      # one step of 8 batches (five fillers)
])
def test_eval_and_predict_batches_are_static_and_whole_steps(name, expected_batches):
    padded, batches = _padded(10, 4, SHAPES[name])
    element, mask = padded.element_spec
    assert element.shape.as_list() == [4, 1] and mask.shape.as_list() == [4]  # static
    assert len(batches) == expected_batches
    masks = np.concatenate([m for _, m in batches])
    values = np.concatenate([x for x, _ in batches])[:, 0]
    assert masks.sum() == 10
    np.testing.assert_array_equal(values[masks], np.arange(10))  # each example once, in order


@pytest.mark.parametrize("environment,env,expected", [
    ("kaggle", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "/kaggle/working/fenwicks"),
    ("colab", {"COLAB_RELEASE_TAG": "release-colab-2026"}, "/content/fenwicks"),
    ("tpu vm", {}, os.path.expanduser("~/fenwicks")),  # a TPU VM may use its local disk
])
@pytest.mark.parametrize("name", SHAPES)
def test_storage_root_on_a_tpu_vm(name, environment, env, expected, on_tpu, monkeypatch):
    for var in ("FENWICKS_ROOT", "KAGGLE_KERNEL_RUN_TYPE", "COLAB_RELEASE_TAG"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    on_tpu(name)
    assert io.default_root() == expected


def test_storage_root_on_a_tpu_node_is_the_bucket(monkeypatch, accel_state):
    acc = tf_devices.detect(accel.Request(), FakeProbe(), env={"TPU_NAME": "grpc://10.0.0.2:8470"})
    assert acc.is_remote and acc.kind == "tpu"
    accel_state(acc)
    monkeypatch.delenv("FENWICKS_ROOT", raising=False)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-2026")  # even on Colab
    monkeypatch.setenv("FENWICKS_BUCKET", "my-bucket")
    assert io.default_root() == "gs://my-bucket"  # the docstring: gs://$FENWICKS_BUCKET
    monkeypatch.delenv("FENWICKS_BUCKET")
    with pytest.raises(ValueError, match="FENWICKS_BUCKET"):
        io.default_root()


@pytest.mark.slow
def test_v5e_1_trains_evaluates_and_predicts_through_the_tpu_path():
    """One replica (Colab's v5e-1) with bfloat16 and XLA, all three modes, for real.

    A OneDeviceStrategy stands in for TPUStrategy; kind, precision and jit_compile are
    decided by the TPU code path. (``python -m tests._tpu_fake 8`` runs the same on 8
    logical CPUs without XLA: 160 s on the shared machine, so it is not a test; cpu:8
    tests cover that strategy.)
    """
    out = run_module_json("tests._tpu_fake", "1", timeout=600)
    assert (out["kind"], out["replicas"], out["precision"]) == ("tpu", 1, "bfloat16")
    assert out["jit_compile"] is True  # the TPU default, not asked for
    assert out["compute_dtype"] == "bfloat16" and out["variable_dtype"] == "float32"
    assert out["global_step"] == 6 and out["losses_finite"]
    assert out["eval_count"] == 37.0            # every example once, none of the padding
    assert out["predictions"] == 37 and out["rows_sum_to_1"]
