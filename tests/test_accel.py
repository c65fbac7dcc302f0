"""fw.accel: each detection branch with a simulated environment, plus the real CPU paths."""

from __future__ import annotations

import json
import socket
import textwrap

import pytest

from fenwicks import _tpu_diagnosis, accel
from tests.conftest import run_json, run_python, start_process


class FakeStrategy:
    def __init__(self, replicas: int):
        self.num_replicas_in_sync = replicas


class FakeResolver:
    def cluster_spec(self):
        class Spec:
            def as_dict(self):
                return {"worker": ["10.0.0.2:8470"]}
        return Spec()


class FakeProbe:
    """Answers like a machine with the given hardware; records what was asked.

    A TPU host is `libtpu=True` (evidence "libtpu is installed") or its `evidence`; what
    the TPU diagnosis reads (`tpu_facts`) comes from `tensorflows`, `libtpu_version`,
    `jax`, `tpu_holders` and `jax_holds_tpu`.
    """

    def __init__(self, libtpu=False, tpu_replicas=8, tpu_fails=False, gpus=(), cpu_name="Fake",
                 nvidia=None, tpu_holders=(), build=None, cuda_error=None, evidence=None,
                 tensorflows=None, libtpu_version=None, jax=None, jax_holds_tpu=False):
        self.libtpu, self.tpu_replicas, self.tpu_fails = libtpu, tpu_replicas, tpu_fails
        self.evidence = list(evidence or (["libtpu is installed"] if libtpu else []))
        self.tensorflows = dict(tensorflows or {"tensorflow-tpu": "2.20.0"})
        self.libtpu_version, self.jax, self.jax_holds = libtpu_version, jax, jax_holds_tpu
        self._gpus = [dict(g) for g in gpus]
        self.cpu_name_value = cpu_name
        self.tpu_addresses: list[str] = []
        self.cpu_replicas: list[int] = []
        # An NVIDIA device TensorFlow may not list, and why (see fw.accel._gpu_unusable).
        self.nvidia, self.holders, self.cuda_error = nvidia, list(tpu_holders), cuda_error
        self.build = build or {"is_cuda_build": True, "cuda_version": "12.5.1",
                               "cudnn_version": "9"}

    def has_libtpu(self):
        return self.libtpu

    def tpu_evidence(self):
        return self.evidence

    def tpu_facts(self):
        return _tpu_diagnosis.TpuFacts(
            evidence=self.evidence, tensorflows=self.tensorflows,
            libtpu=self.libtpu_version, jax=self.jax, holders=self.holders,
            jax_holds_tpu=self.jax_holds, pid=4000)

    def nvidia_evidence(self):
        return self.nvidia

    def tpu_holders(self):
        return self.holders

    def tf_build(self):
        return self.build

    def cuda_load_error(self, build):
        return self.cuda_error

    def tpu_strategy(self, tpu):
        self.tpu_addresses.append(tpu)
        if isinstance(self.tpu_fails, BaseException):
            raise self.tpu_fails
        if self.tpu_fails:
            raise RuntimeError("no TPU here")
        return FakeResolver(), FakeStrategy(self.tpu_replicas)

    def multi_worker_strategy(self):
        return FakeStrategy(2)

    def gpus(self):
        return self._gpus

    def gpu_strategy(self, count):
        return FakeStrategy(count)

    def cpu_strategy(self, replicas):
        self.cpu_replicas.append(replicas)
        return FakeStrategy(replicas)

    def host_memory(self):
        return 8 * 2**30

    def cpu_name(self):
        return self.cpu_name_value


V100 = {"name": "Tesla V100", "compute_capability": (7, 0), "memory": 16 * 2**30}
P100 = {"name": "Tesla P100", "compute_capability": (6, 0), "memory": 16 * 2**30}
AUTO = accel._Request()


def test_tpu_vm_comes_first_even_with_gpus_and_tpu_name():
    probe = FakeProbe(libtpu=True, gpus=[V100])
    acc = accel.detect(AUTO, probe, env={"TPU_NAME": "grpc://10.0.0.2:8470"})
    assert (acc.kind, acc.num_replicas, acc.is_remote) == ("tpu", 8, False)
    assert acc.precision == "bfloat16"
    assert probe.tpu_addresses == ["local"]


def test_libtpu_without_a_tpu_falls_through_to_cpu_with_a_warning():
    probe = FakeProbe(libtpu=True, tpu_fails=True)
    with pytest.warns(accel.AcceleratorWarning, match="no TPU here"):
        acc = accel.detect(AUTO, probe, env={})
    assert acc.kind == "cpu" and acc.num_replicas == 1 and acc.precision == "float32"
    assert len(acc.warnings) == 1


@pytest.mark.parametrize("env,address", [
    ({"TPU_NAME": "grpc://10.0.0.2:8470"}, "grpc://10.0.0.2:8470"),
    ({"COLAB_TPU_ADDR": "10.0.0.3:8470"}, "grpc://10.0.0.3:8470"),
])
def test_tpu_node_is_remote(env, address):
    probe = FakeProbe()
    acc = accel.detect(AUTO, probe, env=env)
    assert (acc.kind, acc.is_remote, acc.num_replicas) == ("tpu", True, 8)
    assert probe.tpu_addresses == [address]
    assert "TPU node" in acc.reason


def test_tpu_node_that_does_not_answer_is_an_error_not_a_fallback():
    with pytest.raises(accel.AcceleratorError, match="TPU_NAME='grpc://bad:1'"):
        accel.detect(AUTO, FakeProbe(tpu_fails=True), env={"TPU_NAME": "grpc://bad:1"})


def test_multi_worker_from_tf_config():
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                            "task": {"type": "worker", "index": 1}})
    acc = accel.detect(AUTO, FakeProbe(), env={"TF_CONFIG": tf_config})
    assert (acc.kind, acc.num_workers, acc.num_replicas) == ("cpu", 2, 2)
    assert "worker:1 of 2" in acc.reason


def test_single_worker_tf_config_is_not_multi_worker():
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}})
    acc = accel.detect(AUTO, FakeProbe(), env={"TF_CONFIG": tf_config})
    assert acc.num_workers == 1 and acc.kind == "cpu"


def test_malformed_tf_config_is_a_clear_error():
    with pytest.raises(accel.AcceleratorError, match="TF_CONFIG is not valid JSON"):
        accel.detect(AUTO, FakeProbe(), env={"TF_CONFIG": "{worker"})


@pytest.mark.parametrize("gpus,replicas,precision", [
    ([V100], 1, "float16"),          # tensor cores: float16 with loss scaling
    ([P100], 1, "float32"),          # compute capability 6.0: float16 is not faster
    ([V100, V100, V100, V100], 4, "float16"),
    ([V100, P100], 2, "float32"),    # the weakest GPU decides
])
def test_gpus(gpus, replicas, precision):
    acc = accel.detect(AUTO, FakeProbe(gpus=gpus), env={})
    assert (acc.kind, acc.num_replicas, acc.precision) == ("gpu", replicas, precision)
    assert acc.devices == tuple(g["name"] for g in gpus)
    assert acc.memory == tuple(g["memory"] for g in gpus)


def test_gpu_replicas_limit_and_excess():
    acc = accel.detect(accel._Request("gpu", 2), FakeProbe(gpus=[V100] * 4), env={})
    assert acc.num_replicas == 2
    with pytest.raises(accel.AcceleratorError, match="replicas=8 GPUs.*only 4"):
        accel.detect(accel._Request("gpu", 8), FakeProbe(gpus=[V100] * 4), env={})


def test_cpu_replicas_and_explicit_precision():
    probe = FakeProbe()
    acc = accel.detect(accel._Request("cpu", 8, "bfloat16"), probe, env={})
    assert (acc.kind, acc.num_replicas, acc.simulated) == ("cpu", 8, True)
    assert acc.precision == "bfloat16" and acc.keras_policy == "mixed_bfloat16"
    assert probe.cpu_replicas == [8]
    assert acc.memory == (8 * 2**30,) * 8


@pytest.mark.parametrize("device", ["tpu", "gpu"])
def test_absent_accelerator_is_an_error_never_a_silent_fallback(device):
    with pytest.raises(accel.AcceleratorError, match=f"no {device.upper()} was found"):
        accel.detect(accel._Request(device), FakeProbe(), env={})


def test_requested_gpu_skips_tpu_and_cpu():
    probe = FakeProbe(libtpu=True, gpus=[V100])
    acc = accel.detect(accel._Request("gpu"), probe, env={"TPU_NAME": "x"})
    assert acc.kind == "gpu" and probe.tpu_addresses == []


def test_reason_says_who_chose_and_what_was_found(monkeypatch):
    assert accel.detect(AUTO, FakeProbe(), env={}).reason == \
        "auto-detection: no TPU or GPU was found, so the CPU"
    assert accel.detect(AUTO, FakeProbe(gpus=[V100, V100]), env={}).reason == \
        "auto-detection: no TPU answered; TensorFlow sees 2 GPUs, so they train in sync, " \
        "one replica each"
    monkeypatch.setattr(accel, "_request", accel._Request())
    monkeypatch.setattr(accel, "_current", None)  # whatever this process already uses
    request = accel._effective_request({"FENWICKS_DEVICE": "cpu:4"})
    assert accel.detect(request, FakeProbe(), env={}).reason.startswith(
        "FENWICKS_DEVICE=cpu:4: the CPU split into 4 logical devices, to simulate 4 replicas")
    accel.configure(device="cpu")
    request = accel._effective_request({})
    assert accel.detect(request, FakeProbe(), env={}).reason == \
        "fw.accel.configure(device='cpu'): the CPU, as asked"


@pytest.mark.parametrize("spec,expected", [
    ("cpu:8", ("cpu", 8)), ("CPU", ("cpu", None)), ("tpu", ("tpu", None)),
    (" gpu:2 ", ("gpu", 2)), ("auto", ("auto", None)),
])
def test_parse_device(spec, expected):
    assert accel.parse_device(spec) == expected


@pytest.mark.parametrize("spec", ["cpu:0", "xpu", "cpu:eight", "cpu:-1", "", "tpu:8:1"])
def test_parse_device_rejects_malformed_specs(spec):
    with pytest.raises(ValueError, match="is not a device spec"):
        accel.parse_device(spec)


def test_env_var_applies_unless_configure_overrides(monkeypatch):
    monkeypatch.setattr(accel, "_request", accel._Request())
    assert accel._effective_request({"FENWICKS_DEVICE": "cpu:4"}) == accel._Request("cpu", 4)
    monkeypatch.setattr(accel, "_request", accel._Request("cpu", 2))
    assert accel._effective_request({"FENWICKS_DEVICE": "cpu:4"}) == accel._Request("cpu", 2)
    monkeypatch.setattr(accel, "_request", accel._Request())
    with pytest.raises(ValueError, match="'cpu:x'"):
        accel._effective_request({"FENWICKS_DEVICE": "cpu:x"})


@pytest.mark.parametrize("kwargs,message", [
    ({"device": "cpu", "replicas": 0}, "replicas=0"),
    ({"device": "cpu:2", "replicas": 4}, "disagree"),
    ({"precision": "float64"}, "precision='float64'"),
])
def test_configure_rejects_bad_arguments(monkeypatch, kwargs, message):
    monkeypatch.setattr(accel, "_request", accel._Request())
    with pytest.raises(ValueError, match=message):
        accel.configure(**kwargs)


def test_configure_after_initialisation_is_refused(monkeypatch):
    acc = accel.Accelerator("cpu", FakeStrategy(1), 1, "float32")
    monkeypatch.setattr(accel, "_current", acc)
    monkeypatch.setattr(accel, "_request", accel._Request())
    with pytest.raises(accel.AcceleratorError, match="already initialised"):
        accel.configure(device="cpu", replicas=8)
    accel.configure()  # asking for what is already there is fine


# ---------------------------------------------------------------- real devices, subprocesses

_REPLICA_SUM = """
import json, tensorflow as tf, fenwicks as fw
acc = fw.accel.current()
@tf.function
def total():
    per_replica = acc.strategy.run(lambda: tf.constant(1.5))
    return acc.strategy.reduce("SUM", per_replica, axis=None)
print(json.dumps({"kind": acc.kind, "replicas": acc.num_replicas, "simulated": acc.simulated,
                  "strategy": type(acc.strategy).__name__, "sum": float(total()),
                  "precision": acc.precision,
                  "multi_worker": isinstance(acc.strategy,
                                             tf.distribute.MultiWorkerMirroredStrategy)}))
"""


def test_real_cpu_and_cpu8_in_subprocesses():
    one = run_json(_REPLICA_SUM, env={"FENWICKS_DEVICE": "auto"})
    assert one == {"kind": "cpu", "replicas": 1, "simulated": False,
                   "strategy": "OneDeviceStrategy", "sum": 1.5, "precision": "float32",
                   "multi_worker": False}
    eight = run_json(_REPLICA_SUM, env={"FENWICKS_DEVICE": "cpu:8"})
    assert eight["replicas"] == 8 and eight["simulated"] is True
    assert eight["strategy"] == "MirroredStrategy"
    assert eight["sum"] == 8 * 1.5


def test_configure_in_code_gives_replicas():
    out = run_json("""
        import json, fenwicks as fw
        fw.accel.configure(device='cpu', replicas=3)
        print(json.dumps(fw.accel.current().num_replicas))
    """, env={"FENWICKS_DEVICE": "auto"})
    assert out == 3


def test_fenwicks_device_tpu_on_this_machine_fails_clearly():
    with pytest.raises(AssertionError) as failure:
        run_python("import fenwicks as fw; fw.accel.current()", env={"FENWICKS_DEVICE": "tpu"})
    assert "AcceleratorError" in str(failure.value)
    assert "no TPU was found" in str(failure.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_worker_cluster_on_loopback():
    """Two processes with TF_CONFIG form a MultiWorkerMirroredStrategy; a sum spans both."""
    workers = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    procs = []
    for index in range(2):
        env = {"FENWICKS_DEVICE": "auto",
               "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                        "task": {"type": "worker", "index": index}})}
        procs.append(start_process(["-c", textwrap.dedent(_REPLICA_SUM)], env))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["multi_worker"] is True
        assert result["replicas"] == 2 and result["sum"] == 2 * 1.5
