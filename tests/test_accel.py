"""fw.accel: each detection branch with a simulated environment, plus the real CPU paths."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import textwrap

import pytest

import fenwicks as fw
from fenwicks import _engine, _tpu_diagnosis, accel
from fenwicks.train.jax import devices as jax_devices
from fenwicks.train.tf import devices as tf_devices
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
        # An NVIDIA device TensorFlow may not list, and why (tf/devices.py: _gpu_unusable).
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
AUTO = accel.Request()


def test_tpu_vm_comes_first_even_with_gpus_and_tpu_name():
    probe = FakeProbe(libtpu=True, gpus=[V100])
    acc = tf_devices.detect(AUTO, probe, env={"TPU_NAME": "grpc://10.0.0.2:8470"})
    assert (acc.kind, acc.num_replicas, acc.is_remote) == ("tpu", 8, False)
    assert acc.precision == "bfloat16"
    assert probe.tpu_addresses == ["local"]


def test_libtpu_without_a_tpu_falls_through_to_cpu_with_a_warning():
    probe = FakeProbe(libtpu=True, tpu_fails=True)
    with pytest.warns(accel.AcceleratorWarning, match="no TPU here"):
        acc = tf_devices.detect(AUTO, probe, env={})
    assert acc.kind == "cpu" and acc.num_replicas == 1 and acc.precision == "float32"
    assert len(acc.warnings) == 1


@pytest.mark.parametrize("env,address", [
    ({"TPU_NAME": "grpc://10.0.0.2:8470"}, "grpc://10.0.0.2:8470"),
    ({"COLAB_TPU_ADDR": "10.0.0.3:8470"}, "grpc://10.0.0.3:8470"),
])
def test_tpu_node_is_remote(env, address):
    probe = FakeProbe()
    acc = tf_devices.detect(AUTO, probe, env=env)
    assert (acc.kind, acc.is_remote, acc.num_replicas) == ("tpu", True, 8)
    assert probe.tpu_addresses == [address]
    assert "TPU node" in acc.reason


def test_tpu_node_that_does_not_answer_is_an_error_not_a_fallback():
    with pytest.raises(accel.AcceleratorError, match="TPU_NAME='grpc://bad:1'"):
        tf_devices.detect(AUTO, FakeProbe(tpu_fails=True), env={"TPU_NAME": "grpc://bad:1"})


def test_multi_worker_from_tf_config():
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                            "task": {"type": "worker", "index": 1}})
    acc = tf_devices.detect(AUTO, FakeProbe(), env={"TF_CONFIG": tf_config})
    assert (acc.kind, acc.num_workers, acc.num_replicas) == ("cpu", 2, 2)
    assert "worker:1 of 2" in acc.reason


def test_single_worker_tf_config_is_not_multi_worker():
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}})
    acc = tf_devices.detect(AUTO, FakeProbe(), env={"TF_CONFIG": tf_config})
    assert acc.num_workers == 1 and acc.kind == "cpu"


def test_malformed_tf_config_is_a_clear_error():
    with pytest.raises(accel.AcceleratorError, match="TF_CONFIG is not valid JSON"):
        tf_devices.detect(AUTO, FakeProbe(), env={"TF_CONFIG": "{worker"})


@pytest.mark.parametrize("gpus,replicas,precision", [
    ([V100], 1, "float16"),          # tensor cores: float16 with loss scaling
    ([P100], 1, "float32"),          # compute capability 6.0: float16 is not faster
    ([V100, V100, V100, V100], 4, "float16"),
    ([V100, P100], 2, "float32"),    # the weakest GPU decides
])
def test_gpus(gpus, replicas, precision):
    acc = tf_devices.detect(AUTO, FakeProbe(gpus=gpus), env={})
    assert (acc.kind, acc.num_replicas, acc.precision) == ("gpu", replicas, precision)
    assert acc.devices == tuple(g["name"] for g in gpus)
    assert acc.memory == tuple(g["memory"] for g in gpus)


def test_gpu_replicas_limit_and_excess():
    acc = tf_devices.detect(accel.Request("gpu", 2), FakeProbe(gpus=[V100] * 4), env={})
    assert acc.num_replicas == 2
    with pytest.raises(accel.AcceleratorError, match="replicas=8 GPUs.*only 4"):
        tf_devices.detect(accel.Request("gpu", 8), FakeProbe(gpus=[V100] * 4), env={})


def test_cpu_replicas_and_explicit_precision():
    probe = FakeProbe()
    acc = tf_devices.detect(accel.Request("cpu", 8, "bfloat16"), probe, env={})
    assert (acc.kind, acc.num_replicas, acc.simulated) == ("cpu", 8, True)
    assert acc.precision == "bfloat16" and acc.keras_policy == "mixed_bfloat16"
    assert probe.cpu_replicas == [8]
    assert acc.memory == (8 * 2**30,) * 8


@pytest.mark.parametrize("device", ["tpu", "gpu"])
def test_absent_accelerator_is_an_error_never_a_silent_fallback(device):
    with pytest.raises(accel.AcceleratorError, match=f"no {device.upper()} was found"):
        tf_devices.detect(accel.Request(device), FakeProbe(), env={})


def test_requested_gpu_skips_tpu_and_cpu():
    probe = FakeProbe(libtpu=True, gpus=[V100])
    acc = tf_devices.detect(accel.Request("gpu"), probe, env={"TPU_NAME": "x"})
    assert acc.kind == "gpu" and probe.tpu_addresses == []


def test_reason_says_who_chose_and_what_was_found(accel_state):
    assert tf_devices.detect(AUTO, FakeProbe(), env={}).reason == \
        "auto-detection: no TPU or GPU was found, so the CPU"
    assert tf_devices.detect(AUTO, FakeProbe(gpus=[V100, V100]), env={}).reason == \
        "auto-detection: no TPU answered; TensorFlow sees 2 GPUs, so they train in sync, " \
        "one replica each"
    accel_state()  # not whatever this process already uses
    request = accel.effective_request({"FENWICKS_DEVICE": "cpu:4"})
    assert tf_devices.detect(request, FakeProbe(), env={}).reason.startswith(
        "FENWICKS_DEVICE=cpu:4: the CPU split into 4 logical devices, to simulate 4 replicas")
    accel.configure(device="cpu")
    request = accel.effective_request({})
    assert tf_devices.detect(request, FakeProbe(), env={}).reason == \
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


def test_env_var_applies_unless_configure_overrides(accel_state):
    accel_state()
    assert accel.effective_request({"FENWICKS_DEVICE": "cpu:4"}) == accel.Request("cpu", 4)
    accel_state(request=accel.Request("cpu", 2))
    assert accel.effective_request({"FENWICKS_DEVICE": "cpu:4"}) == accel.Request("cpu", 2)
    accel_state()
    with pytest.raises(ValueError, match="'cpu:x'"):
        accel.effective_request({"FENWICKS_DEVICE": "cpu:x"})


@pytest.mark.parametrize("kwargs,message", [
    ({"device": "cpu", "replicas": 0}, "replicas=0"),
    ({"device": "cpu:2", "replicas": 4}, "disagree"),
    ({"precision": "float64"}, "precision='float64'"),
])
def test_configure_rejects_bad_arguments(accel_state, kwargs, message):
    accel_state()
    with pytest.raises(ValueError, match=message):
        accel.configure(**kwargs)


def test_configure_after_initialisation_is_refused(accel_state):
    acc = accel.Accelerator("cpu", 1, "float32")
    accel_state(acc)
    with pytest.raises(accel.AcceleratorError, match="already initialised"):
        accel.configure(device="cpu", replicas=8)
    accel.configure()  # asking for what is already there is fine


# ---------------------------------------------------------------- real devices, subprocesses

_REPLICA_SUM = """
import json, tensorflow as tf, fenwicks as fw
acc = fw.accel.current()
strategy = fw.train.tf.strategy()
@tf.function
def total():
    per_replica = strategy.run(lambda: tf.constant(1.5))
    return strategy.reduce("SUM", per_replica, axis=None)
print(json.dumps({"kind": acc.kind, "replicas": acc.num_replicas, "simulated": acc.simulated,
                  "strategy": type(strategy).__name__, "sum": float(total()),
                  "precision": acc.precision,
                  "multi_worker": isinstance(strategy,
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


# ------------------------------------------------------------------- the engine decision

KAGGLE_TPU = _engine.HostFacts(  # Kaggle/docker-python tpu/: what the image installs
    {"tensorflow-cpu": "2.20.0", "jax": "0.7.2", "jaxlib": "0.7.2", "libtpu": "0.0.17"})
KAGGLE_ENV = {"ISTPUVM": "1", "TPU_PROCESS_ADDRESSES": "local"}
COLAB_TPU = _engine.HostFacts({"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"})
TPU_VM_TF = _engine.HostFacts({"tensorflow-tpu": "2.20.0", "libtpu": "0.0.14"},
                              tpu_files=("/dev/vfio/0",))
COLAB_GPU = _engine.HostFacts({"tensorflow": "2.21.0", "jax": "0.10.2"})


@pytest.mark.parametrize("env,facts,engine,reason", [
    ({}, COLAB_GPU, "tf", "auto: not a TPU host"),
    (KAGGLE_ENV, KAGGLE_TPU, "jax",
     "auto: this is a TPU host (ISTPUVM=1, TPU_PROCESS_ADDRESSES=local, libtpu 0.0.17 is "
     "installed) and its TensorFlow is a CPU-only build (tensorflow-cpu 2.20.0; the TPU "
     "build is tensorflow-tpu), so TensorFlow cannot reach the TPU; JAX 0.7.2 can"),
    ({}, COLAB_TPU, "jax",
     "auto: this is a TPU host (libtpu 0.0.42.1 is installed) and it has no TensorFlow, so "
     "TensorFlow cannot reach the TPU; JAX 0.10.2 can"),
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, TPU_VM_TF, "tf",
     "auto: this TPU host has tensorflow-tpu 2.20.0"),
    (KAGGLE_ENV, _engine.HostFacts({"tensorflow-cpu": "2.20.0"}), "tf",
     "auto: a TPU host where its TensorFlow is a CPU-only build (tensorflow-cpu 2.20.0; "
     "the TPU build is tensorflow-tpu), and JAX is not installed"),
    ({}, _engine.HostFacts({"tensorflow": "2.21.0", "jax": "0.10.2"},
                           tpu_files=("/dev/accel0",)), "jax", None),
    ({"FENWICKS_ENGINE": "tf", **KAGGLE_ENV}, KAGGLE_TPU, "tf", "FENWICKS_ENGINE=tf"),
    ({"FENWICKS_ENGINE": "jax"}, COLAB_GPU, "jax", "FENWICKS_ENGINE=jax"),
    ({"FENWICKS_ENGINE": "JAX", "KERAS_BACKEND": "jax"}, COLAB_GPU, "jax",
     "FENWICKS_ENGINE=JAX"),
    ({"KERAS_BACKEND": "jax"}, COLAB_GPU, "jax", "KERAS_BACKEND=jax"),
    ({"KERAS_BACKEND": "tensorflow", **KAGGLE_ENV}, KAGGLE_TPU, "tf", "KERAS_BACKEND=tensorflow"),
])
def test_the_engine_decision_table(env, facts, engine, reason):
    choice = _engine.choose_engine(env, facts)
    assert choice.engine == engine
    assert choice.keras_backend == {"tf": "tensorflow", "jax": "jax"}[engine]
    if reason is not None:
        assert choice.reason == reason
    # Only the engine chosen by the machine itself is announced at import.
    assert choice.announce == (engine == "jax" and choice.reason.startswith("auto:"))
    assert _engine.choose_engine(env, facts) == choice  # a pure function of its inputs


def test_the_announcement_is_one_line_saying_why_and_how_to_insist_on_tf():
    line = _engine.announcement(_engine.choose_engine(KAGGLE_ENV, KAGGLE_TPU))
    assert line == (
        "fenwicks: Keras runs on JAX (the jax engine) because this is a TPU host (ISTPUVM=1, "
        "TPU_PROCESS_ADDRESSES=local, libtpu 0.0.17 is installed) and its TensorFlow is a "
        "CPU-only build (tensorflow-cpu 2.20.0; the TPU build is tensorflow-tpu), so "
        "TensorFlow cannot reach the TPU; JAX 0.7.2 can; TensorFlow only feeds tf.data. Set "
        "FENWICKS_ENGINE=tf before importing fenwicks to insist on TensorFlow.")
    assert "\n" not in line


@pytest.mark.parametrize("env,facts,message", [
    ({"KERAS_BACKEND": "torch"}, COLAB_GPU,
     "KERAS_BACKEND=torch is set, but Fenwicks runs Keras only on TensorFlow or JAX; unset "
     "KERAS_BACKEND (or set it to tensorflow or jax) before importing fenwicks, in a new "
     "Python process."),
    ({"KERAS_BACKEND": "jax"}, _engine.HostFacts({"tensorflow": "2.21.0"}),
     "KERAS_BACKEND=jax is set, but JAX is not installed; Fenwicks runs Keras on JAX only "
     "where JAX is installed: pip install jax (on a TPU VM: pip install 'jax[tpu]'), or unset "
     "it to run on TensorFlow."),
    ({"FENWICKS_ENGINE": "jax"}, _engine.HostFacts({"tensorflow": "2.21.0"}),
     "FENWICKS_ENGINE=jax is set, but JAX is not installed; Fenwicks runs Keras on JAX only "
     "where JAX is installed: pip install jax (on a TPU VM: pip install 'jax[tpu]'), or unset "
     "it to run on TensorFlow."),
    ({"FENWICKS_ENGINE": "torch"}, COLAB_GPU,
     "FENWICKS_ENGINE='torch' is not an engine Fenwicks has; set FENWICKS_ENGINE=tf or "
     "FENWICKS_ENGINE=jax (or unset it to choose automatically) before importing fenwicks."),
    ({"FENWICKS_ENGINE": "jax", "KERAS_BACKEND": "tensorflow"}, COLAB_GPU,
     "FENWICKS_ENGINE=jax and KERAS_BACKEND=tensorflow disagree: the jax engine runs Keras "
     "on 'jax'; unset KERAS_BACKEND or set it to jax before importing fenwicks."),
    ({}, dataclasses.replace(COLAB_GPU, keras_backend="torch"),
     "keras was imported before fenwicks with the 'torch' backend, but Fenwicks runs Keras "
     "on 'tensorflow' here (auto: not a TPU host); Keras fixes its backend when it is first "
     "imported, so restart the Python process and import fenwicks before keras, or set "
     "KERAS_BACKEND=torch before both if Fenwicks supports it (tensorflow or jax)."),
    ({"FENWICKS_ENGINE": "jax"}, dataclasses.replace(COLAB_GPU, keras_backend="tensorflow"),
     "keras was imported before fenwicks with the 'tensorflow' backend, but Fenwicks runs "
     "Keras on 'jax' here (FENWICKS_ENGINE=jax); Keras fixes its backend when it is first "
     "imported, so restart the Python process and import fenwicks before keras, or set "
     "KERAS_BACKEND=tensorflow before both if Fenwicks supports it (tensorflow or jax)."),
])
def test_an_engine_fenwicks_cannot_run_on_is_one_clear_sentence(env, facts, message):
    with pytest.raises(_engine.EngineError) as failure:
        _engine.choose_engine(env, facts)
    assert str(failure.value) == message


def test_auto_follows_a_keras_imported_before_fenwicks_and_says_so():
    # A Kaggle notebook that ran `import keras` (tensorflow, Keras's default) first.
    facts = dataclasses.replace(KAGGLE_TPU, keras_backend="tensorflow")
    choice = _engine.choose_engine(KAGGLE_ENV, facts)
    assert (choice.engine, choice.announce) == ("tf", True)
    assert _engine.announcement(choice) == (
        "fenwicks: Keras runs on tensorflow (the tf engine) because keras was imported before "
        "fenwicks, on 'tensorflow'; auto-detection would have chosen jax (auto: this is a TPU "
        "host (ISTPUVM=1, TPU_PROCESS_ADDRESSES=local, libtpu 0.0.17 is installed) and its "
        "TensorFlow is a CPU-only build (tensorflow-cpu 2.20.0; the TPU build is "
        "tensorflow-tpu), so TensorFlow cannot reach the TPU; JAX 0.7.2 can). To run on the "
        "jax engine, import fenwicks before keras, in a new Python process.")
    same = _engine.choose_engine({}, dataclasses.replace(COLAB_GPU, keras_backend="tensorflow"))
    assert (same.engine, same.announce) == ("tf", False)


def test_tpu_host_evidence_reads_env_distributions_and_device_files():
    facts = _engine.HostFacts({"libtpu": "0.0.17"}, tpu_files=("/dev/vfio/0",))
    env = {"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": "", "COLAB_TPU_ADDR": "10.0.0.2:8470"}
    assert _engine.tpu_host_evidence(env, facts) == [
        "ISTPUVM=1", "COLAB_TPU_ADDR=10.0.0.2:8470", "libtpu 0.0.17 is installed",
        "/dev/vfio/0 exists"]
    assert _engine.tpu_host_evidence({}, _engine.HostFacts({}, libtpu_module=True)) == [
        "libtpu is installed"]
    assert _engine.tpu_host_evidence({}, COLAB_GPU) == []


def test_host_facts_of_this_machine_see_tensorflow_and_jax():
    facts = _engine.HostFacts.gather()
    assert set(facts.tensorflows) & set(_engine.TF_DISTRIBUTIONS)
    assert facts.jax_version is not None  # setup.py's test extra installs jax
    assert facts.keras_backend == "tensorflow"  # this pytest process imported fenwicks


@pytest.mark.parametrize("before,replicas,after", [
    ("", 8, "--xla_force_host_platform_device_count=8"),
    ("--xla_dump_to=/tmp/x", 8, "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8"),
    ("--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x", 4,
     "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"),
    ("--xla_dump_to=/tmp/x", None, "--xla_dump_to=/tmp/x"),
])
def test_cpu_n_on_jax_appends_the_host_device_count_to_xla_flags(before, replicas, after):
    env = {"XLA_FLAGS": before} if before else {}
    _engine.force_cpu_devices(env, replicas)
    assert env.get("XLA_FLAGS", "") == after
    assert env["JAX_PLATFORMS"] == "cpu"


def test_configure_accepts_only_the_engine_keras_runs_on(accel_state):
    accel_state()
    assert accel.engine() == "tf"  # this process: not a TPU host, no FENWICKS_ENGINE
    accel.configure(engine="tf")
    with pytest.raises(accel.AcceleratorError) as failure:
        accel.configure(engine="jax")
    assert str(failure.value) == (
        "engine='jax' was asked, but Keras in this process runs on 'tensorflow' (the tf "
        "engine, chosen at import fenwicks: auto: not a TPU host); Keras fixes its backend "
        "when it is imported, so set FENWICKS_ENGINE=jax before `import fenwicks`, in a new "
        "Python process")
    with pytest.raises(ValueError, match="engine='torch' must be one of"):
        accel.configure(engine="torch")


class FakeJaxProbe(FakeProbe):
    """JAX's side of a machine: its devices, and what its TPU backend said."""

    def __init__(self, platform="cpu", count=1, device_kind="cpu", errors=None,
                 capability=None, **kwargs):
        super().__init__(**kwargs)
        self._devices = [{"platform": platform, "kind": device_kind, "id": i,
                          "memory": 16 * 2**30 if platform != "cpu" else None,
                          "compute_capability": capability} for i in range(count)]
        self.errors = errors or {}

    def devices(self):
        return self._devices

    def process_count(self):
        return 1

    def backend_errors(self):
        return self.errors

    def gpus(self):
        return [d for d in self._devices if d["platform"] == "gpu"]

    def device_count(self):
        return len(self._devices) * self.process_count()


@pytest.mark.parametrize("probe,kind,replicas,precision", [
    (FakeJaxProbe("tpu", 8, "TPU v5 lite", libtpu=True), "tpu", 8, "bfloat16"),
    (FakeJaxProbe("gpu", 2, "Tesla T4", capability=(7, 5)), "gpu", 2, "float16"),
    (FakeJaxProbe("gpu", 1, "Tesla P100", capability=(6, 0)), "gpu", 1, "float32"),
    (FakeJaxProbe("cpu", 1), "cpu", 1, "float32"),
])
def test_the_jax_engine_describes_jax_devices(probe, kind, replicas, precision):
    acc = jax_devices.detect_jax(AUTO, probe)
    assert (acc.engine, acc.kind, acc.num_replicas, acc.precision) == \
        ("jax", kind, replicas, precision)
    with pytest.raises(AttributeError, match=r"fw.train.tf.strategy\(\)"):
        acc.strategy  # noqa: B018 - devices only: JAX places the replicas, no strategy
    assert acc.warnings == ()


def test_jax_cpu_n_is_simulated_and_a_wrong_count_is_an_error():
    eight = accel.Request("cpu", 8, source="FENWICKS_DEVICE=cpu:8")
    acc = jax_devices.detect_jax(eight, FakeJaxProbe("cpu", 8))
    assert (acc.kind, acc.num_replicas, acc.simulated) == ("cpu", 8, True)
    assert acc.reason.startswith("FENWICKS_DEVICE=cpu:8: the CPU split into 8 JAX devices")
    with pytest.raises(accel.AcceleratorError, match="JAX has 1 device"):
        jax_devices.detect_jax(eight, FakeJaxProbe("cpu", 1))
    with pytest.raises(accel.AcceleratorError, match="its tpu backend failed: UNKNOWN"):
        jax_devices.detect_jax(accel.Request("tpu"), FakeJaxProbe(errors={"tpu": "UNKNOWN: x"}))


# ------------------------------------------------------- the engine in a real new process

_ENGINE_PROBE = """
import json, os, sys
{prelude}
try:
    import fenwicks as fw
except ImportError as err:
    print(json.dumps({{"error": type(err).__name__, "message": str(err)}}))
    raise SystemExit(0)
import keras
from fenwicks import report
acc = fw.accel.current()
rows = report.info_rows()
print(json.dumps({{"engine": fw.accel.engine(), "backend": keras.backend.backend(),
                  "info_engine": dict(rows)["engine"],
                  "info_devices": [v for k, v in rows if k.startswith("device ")],
                  "kind": acc.kind, "replicas": acc.num_replicas, "acc_engine": acc.engine,
                  "simulated": acc.simulated, "env_backend": os.environ.get("KERAS_BACKEND"),
                  "jax_devices": len(__import__("jax").devices()) if "jax" in sys.modules
                  else None}}))
"""
# JAX missing as the decision sees it: no distribution metadata, not importable.
_NO_JAX = """
import importlib.metadata as md
real = md.version
def version(name):
    if name in ("jax", "jaxlib"):
        raise md.PackageNotFoundError(name)
    return real(name)
md.version = version
sys.modules["jax"] = None
"""


def test_engines_in_new_processes():
    """KERAS_BACKEND and FENWICKS_ENGINE as a user sets them, each in a new interpreter."""
    def run(env, prelude=""):
        env = {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
               "XLA_FLAGS": None, **env}
        return run_json(_ENGINE_PROBE.format(prelude=prelude), env=env, fresh=True)

    jax8 = run({"FENWICKS_ENGINE": "jax", "FENWICKS_DEVICE": "cpu:8"})
    info_devices = jax8.pop("info_devices")
    assert jax8 == {"engine": "jax", "backend": "jax", "kind": "cpu", "replicas": 8,
                    "acc_engine": "jax", "simulated": True, "env_backend": None,
                    "jax_devices": 8, "info_engine": "jax (Keras on jax; FENWICKS_ENGINE=jax)"}
    assert [d.split(",")[0] for d in info_devices] == [f"cpu (cpu:{i})" for i in range(8)]
    configured = run({"FENWICKS_ENGINE": "jax"},
                     prelude="import fenwicks as fw; fw.accel.configure(device='cpu:4')")
    assert (configured["engine"], configured["replicas"], configured["jax_devices"]) == \
        ("jax", 4, 4)
    on_jax = run({"KERAS_BACKEND": "jax"})
    assert (on_jax["engine"], on_jax["backend"], on_jax["replicas"]) == ("jax", "jax", 1)
    assert on_jax["info_engine"] == "jax (Keras on jax; KERAS_BACKEND=jax)"
    assert on_jax["env_backend"] == "jax"  # the user's own setting stays
    torch = run({"KERAS_BACKEND": "torch"})
    assert torch["error"] == "EngineError"
    assert torch["message"].startswith("KERAS_BACKEND=torch is set, but Fenwicks runs Keras "
                                       "only on TensorFlow or JAX")
    no_jax = run({"KERAS_BACKEND": "jax"}, prelude=_NO_JAX)
    assert no_jax["error"] == "EngineError"
    assert no_jax["message"].startswith("KERAS_BACKEND=jax is set, but JAX is not installed")


# orbax-checkpoint missing, as `import orbax` sees it (it stays installed on disk).
_NO_ORBAX = """
import importlib.abc
class HideOrbax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "orbax" or name.startswith("orbax."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, HideOrbax())
"""
NO_ORBAX = ("KERAS_BACKEND=jax is set, but orbax-checkpoint, which Fenwicks saves its "
            "checkpoints with on every engine, is not installed: pip install "
            "orbax-checkpoint (a dependency of fenwicks: pip install fenwicks installs it), "
            "then restart Python.")


def test_the_jax_engine_without_orbax_is_named_at_import():
    """Was: `import fenwicks` worked and train() raised a bare ModuleNotFoundError."""
    assert str(pytest.raises(_engine.EngineError, _engine.choose_engine, {
        "KERAS_BACKEND": "jax"}, dataclasses.replace(COLAB_GPU, orbax_module=False)
    ).value) == NO_ORBAX
    auto = pytest.raises(_engine.EngineError, _engine.choose_engine, {},
                         dataclasses.replace(COLAB_TPU, orbax_module=False)).value
    assert str(auto).startswith("Fenwicks chose the jax engine (this TPU host's "
                                "TensorFlow cannot reach the TPU), but orbax-checkpoint")
    # The tf engine writes the same checkpoints (the run format), with orbax too.
    tf = pytest.raises(_engine.EngineError, _engine.choose_engine, {},
                       dataclasses.replace(COLAB_GPU, orbax_module=False)).value
    assert str(tf).startswith("Fenwicks chose the tf engine (auto: not a TPU host), but "
                              "orbax-checkpoint, which Fenwicks saves its checkpoints with")
    env = {"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
           "XLA_FLAGS": None}
    hidden = run_json(_ENGINE_PROBE.format(prelude=_NO_ORBAX), env=env, fresh=True)
    assert hidden == {"error": "EngineError", "message": NO_ORBAX}


def test_orbax_without_tensorstore_is_named_at_import_on_either_engine():
    """Was: `import fenwicks` worked and train() raised a raw ModuleNotFoundError."""
    for env, starts in (({"FENWICKS_ENGINE": "tf"}, "FENWICKS_ENGINE=tf is set"),
                        ({"KERAS_BACKEND": "jax"}, "KERAS_BACKEND=jax is set")):
        message = str(pytest.raises(_engine.EngineError, _engine.choose_engine, env,
                                    dataclasses.replace(COLAB_GPU, tensorstore_module=False)
                                    ).value)
        assert message == (f"{starts}, but tensorstore, which orbax-checkpoint writes "
                           "Fenwicks' checkpoints with, is not installed: pip install "
                           "tensorstore (a dependency of fenwicks), then restart Python.")


def test_the_tf_engine_keeps_jax_off_the_gpu_when_orbax_imports_it():
    """orbax-checkpoint (and TensorFlow itself) import JAX; on a GPU machine JAX would
    claim the GPU and preallocate most of its memory, which TensorFlow needs. On the tf
    engine JAX is imported with JAX_PLATFORMS=cpu for that import only (later processes
    choose for themselves), and a JAX imported earlier is told through its config."""
    out = run_json("""
import json, os, sys
os.environ.pop("JAX_PLATFORMS", None)
os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
import fenwicks as fw
from fenwicks.train import run_format
run_format.ocp()  # what a checkpoint does first: imports orbax, and JAX with it
import jax
print(json.dumps({"engine": fw.accel.engine(), "platforms": jax.config.jax_platforms,
                  "devices": sorted({d.platform for d in jax.devices()}),
                  "env": [os.environ.get("JAX_PLATFORMS"),
                          os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")]}))
""", env={"FENWICKS_ENGINE": "tf", "KERAS_BACKEND": None, "JAX_PLATFORMS": None},
        fresh=True)
    assert out == {"engine": "tf", "platforms": "cpu", "devices": ["cpu"],
                   "env": [None, None]}
    imported_first = run_json("""
import json, os
os.environ.pop("JAX_PLATFORMS", None)
import jax  # a user's import, before fenwicks: its devices not made yet
import fenwicks as fw
from fenwicks.train import run_format
run_format.ocp()
print(json.dumps([jax.config.jax_platforms, jax.devices()[0].platform]))
""", env={"FENWICKS_ENGINE": "tf", "KERAS_BACKEND": None, "JAX_PLATFORMS": None},
        fresh=True)
    assert imported_first == ["cpu", "cpu"]


# ----------------------------------------------------- the strategy is the tf engine's


def test_an_accelerator_has_no_strategy_and_says_where_it_went():
    acc = accel.Accelerator("cpu", 1, "float32")
    with pytest.raises(AttributeError, match=(
            r"fw.accel.current\(\).strategy is gone: the Accelerator describes devices only "
            r"\(kind, count, memory, precision\), and the tf.distribute strategy belongs to "
            r"the tf engine: use fw.train.tf.strategy\(\)")):
        acc.strategy  # noqa: B018


def test_the_tf_engine_keeps_the_strategy_it_made_for_its_devices(accel_state):
    acc = tf_devices.detect_devices(AUTO, FakeProbe(gpus=[V100, V100]), env={})
    assert (acc.kind, acc.num_replicas) == ("gpu", 2)
    accel_state(acc)
    made = fw.train.tf.strategy()
    assert isinstance(made, FakeStrategy) and made.num_replicas_in_sync == 2
    assert accel.distribution() == "FakeStrategy"  # fw.info()'s strategy row
    from fenwicks.train import engines

    assert engines.current().num_replicas(acc) == 2  # the engine reads its strategy


def test_an_accelerator_the_tf_engine_did_not_detect_has_no_strategy(accel_state):
    accel_state(accel.Accelerator("tpu", 8, "bfloat16"))  # a test's fake, set by hand
    with pytest.raises(accel.AcceleratorError, match=(
            r"no tf.distribute strategy was made for the accelerator in use \(tpu, tf "
            r"engine, set by a test\): TensorFlow's engine makes it when it detects the "
            r"devices")):
        fw.train.tf.strategy()
    assert accel.distribution() == "none (the accelerator was not detected by the tf engine)"


def test_jit_compile_on_logical_cpu_replicas_is_the_tf_engines_refusal(accel_state, tmp_path,
                                                                        caplog):
    acc = tf_devices.detect_devices(accel.Request("cpu", 8), FakeProbe(), env={})
    accel_state(acc)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=4, input_shape=(8, 8, 1)),
        fw.train.sgd_optimizer(0.1))
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        est = fw.train.get_tpu_estimator(10, model_func, str(tmp_path), trn_bs=16,
                                         jit_compile=True)
    assert est.config.jit_compile is False and est.num_replicas == 8
    assert ("fenwicks: jit_compile is ignored on 8 logical CPU replicas (XLA does not "
            "support variables spread over logical CPU devices)") in caplog.text


_STRATEGY_ON_JAX = """
import json
import fenwicks as fw
try:
    fw.train.tf.strategy()
    error = None
except fw.accel.AcceleratorError as err:
    error = str(err)
print(json.dumps({"engine": fw.accel.engine(), "error": error,
                  "row": dict(fw.report.info_rows())["strategy"]}))
"""


def test_the_jax_engine_has_no_strategy_and_says_so():
    result = run_json(_STRATEGY_ON_JAX, env={"FENWICKS_ENGINE": "jax", "KERAS_BACKEND": None,
                                             "FENWICKS_DEVICE": None})
    assert result["engine"] == "jax"
    assert result["error"] == (
        "fw.train.tf.strategy() is the tf engine's tf.distribute strategy, and this process "
        "runs on the jax engine, which places the replicas itself (no strategy exists); set "
        "FENWICKS_ENGINE=tf before importing fenwicks to train under one")
    assert result["row"].startswith("none: JAX places the ")
