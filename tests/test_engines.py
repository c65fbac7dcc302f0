"""The engine registry (`fenwicks._engine.REGISTRY`): one entry per engine naming every
part of it, found by the shared code through the entry alone; and the precision rule both
engines' detectors apply (`fenwicks._precision`)."""

from __future__ import annotations

import importlib
import importlib.util

import keras
import pytest

from fenwicks import _engine, _precision
from fenwicks.train import engines

_FACTS = ("is_symbolic", "data_parallel_replicas", "SYNCS_BATCHNORM",
          "LASTING_BACKEND_VARIABLES", "sum_gradients", "update_each")


def test_each_engine_has_one_entry_naming_all_its_parts():
    assert set(_engine.REGISTRY) == {"tf", "jax", "reference"}
    for name, entry in _engine.REGISTRY.items():
        assert entry.name == name
        for module in (entry.module, entry.devices, entry.facts, entry.reader):
            assert module is None or importlib.util.find_spec(module) is not None, module
    # FENWICKS_ENGINE chooses among the engines of a Keras backend; the reference engine
    # runs under any backend, so it has no detector and no backend facts of its own.
    assert _engine.ENGINES == ("tf", "jax")
    assert _engine.KERAS_BACKEND == {"tf": "tensorflow", "jax": "jax"}
    reference = _engine.REGISTRY["reference"]
    assert (reference.keras_backend, reference.devices, reference.facts) == (None,) * 3
    assert engines.REGISTRY is _engine.REGISTRY  # one table, not a copy
    assert _engine.readers() == {"tf": "fenwicks.train.tf.weights",
                                 "jax": "fenwicks.train.jax.weights",
                                 "reference": "fenwicks.train.reference.weights"}


def test_the_running_engines_entry_gives_its_detector_facts_and_roles():
    entry = _engine.entry_for_backend(keras.backend.backend())
    assert entry is _engine.REGISTRY["tf"]
    devices = _engine.devices_module("tf")
    assert _engine.detector("tf") is devices.detect_devices
    assert callable(devices.describe_distribution)
    facts = _engine.backend_facts()
    assert facts is importlib.import_module(entry.facts)
    assert all(hasattr(facts, name) for name in _FACTS)
    assert (facts.SYNCS_BATCHNORM, facts.LASTING_BACKEND_VARIABLES) == (True, True)
    assert engines.current() is importlib.import_module(entry.module).ENGINE
    assert _engine.entry_for_backend("torch") is None


def test_backend_facts_refuse_a_backend_no_engine_runs_on(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(ValueError, match=r"Keras runs on 'torch'; Fenwicks' engines run on "
                                         r"\['jax', 'tensorflow'\]"):
        _engine.backend_facts()


@pytest.mark.parametrize("kind, capabilities, expected", [
    ("tpu", [], "bfloat16"),
    ("gpu", [(7, 0)], "float16"),           # V100: tensor cores
    ("gpu", [(7, 5), (8, 0)], "float16"),
    ("gpu", [(6, 0)], "float32"),           # P100: float16 slower than float32
    ("gpu", [(7, 5), (6, 1)], "float32"),   # one old GPU decides for all
    ("gpu", [None], "float32"),             # capability unknown
    ("gpu", [], "float32"),
    ("cpu", [], "float32"),
])
def test_auto_precision_is_one_rule_for_both_engines(kind, capabilities, expected):
    assert _precision.auto_precision(kind, capabilities) == expected
    assert _precision.keras_policy(expected) == (
        "float32" if expected == "float32" else f"mixed_{expected}")
