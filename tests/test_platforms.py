"""A TPU or GPU that is present but unusable is a loud warning (never a silent CPU run),
and `import fenwicks` without TensorFlow names the extra for the machine it is on."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings

import pytest

from fenwicks import _engine, _host, accel
from fenwicks.train.jax import devices as jax_devices
from fenwicks.train.tf import devices as tf_devices
from tests.conftest import ROOT, run_python
from tests.test_accel import V100, FakeJaxProbe, FakeProbe

AUTO = accel.Request()
BUSY = RuntimeError("TPU initialization failed: open(/dev/accel0): Device or resource busy: "
                    "Device or resource busy; Couldn't open device: /dev/accel0")
NO_CUDNN = "libcudnn.so.9: cannot open shared object file: No such file or directory"
# TensorFlow 2.20's error on the Kaggle TPU image replica (tensorflow-cpu 2.20.0, libtpu
# 0.0.17, ISTPUVM=1): TPUClusterResolver('local') + initialize_tpu_system, first two lines.
NO_KERNEL = RuntimeError(
    "TPUs not found in the cluster. Failed in initialization: No OpKernel was registered to "
    "support Op 'ConfigureDistributedTPU' used by {{node ConfigureDistributedTPU}}\n"
    "Registered devices: [CPU]")
KAGGLE = ["ISTPUVM=1", "TPU_PROCESS_ADDRESSES=local", "libtpu 0.0.17 is installed"]
INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
ON_CPU = " Fenwicks chose the CPU (1 replica, float32) instead."


def _detect_warning(request, probe, caplog):
    """Detects; returns (accelerator, the one AcceleratorWarning text)."""
    caplog.set_level(logging.WARNING, logger="fenwicks")
    caplog.clear()
    with pytest.warns(accel.AcceleratorWarning) as caught:
        acc = tf_devices.detect(request, probe, env={})
    texts = [str(w.message) for w in caught if w.category is accel.AcceleratorWarning]
    assert len(texts) == 1, texts
    # One channel: no log record repeats the warning (a user would read it twice).
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []
    assert acc.warnings == (texts[0],)
    return acc, texts[0]


def _never_a_second_tensorflow(text):
    """No advice installs a TensorFlow distribution without removing the one there."""
    for match in re.finditer(r"pip install [^,;]*?'?(tensorflow[\w-]*)", text):
        before = text[:match.start()]
        assert "pip uninstall -y" in before or "--force-reinstall" in match.group(0), text


# One test per cause a TPU TensorFlow cannot use (fenwicks._tpu_diagnosis), each reading the
# whole warning and the "chosen by" reason, which names the same cause.

def test_a_cpu_only_tensorflow_on_a_tpu_host_points_to_the_jax_engine(caplog):
    probe = FakeProbe(evidence=KAGGLE, tensorflows={"tensorflow-cpu": "2.20.0"},
                      libtpu_version="0.0.17", jax="0.7.2", tpu_fails=NO_KERNEL)
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert (acc.kind, acc.num_replicas, acc.precision) == ("cpu", 1, "float32")
    assert acc.reason == ("auto-detection: a CPU-only TensorFlow cannot use the TPU here (see "
                          "the WARNING); no other TPU or GPU was found, so the CPU")
    assert text == (
        "a TPU is on this machine (ISTPUVM=1, TPU_PROCESS_ADDRESSES=local, libtpu 0.0.17 is "
        "installed) but the installed TensorFlow (tensorflow-cpu 2.20.0) is a CPU-only build "
        "without TPU kernels (RuntimeError: TPUs not found in the cluster. Failed in "
        "initialization: No OpKernel was registered to support Op 'ConfigureDistributedTPU' "
        "used by {{node ConfigureDistributedTPU}}), so TensorFlow cannot use the TPU. Fix: "
        "run on the jax engine, which reaches this TPU through JAX 0.7.2 and the libtpu "
        "installed: set FENWICKS_ENGINE=jax before importing fenwicks, in a new Python "
        "process (the engine is chosen at import). To train on TensorFlow instead, replace "
        "it with the TPU build (its newest release is 2.20.0): pip uninstall -y "
        f"tensorflow-cpu, then pip install 'tensorflow-tpu==2.20.0' -f {INDEX} (Google's "
        "instructions: the libtpu made for that TensorFlow; it replaces libtpu 0.0.17, which "
        "JAX or torch_xla here may be built against), then start a new Python process."
        + ON_CPU)
    _never_a_second_tensorflow(text)


def test_a_cpu_only_tensorflow_without_jax_says_to_install_jax(caplog):
    probe = FakeProbe(evidence=KAGGLE, tensorflows={"tensorflow": "2.21.0"},
                      libtpu_version="0.0.17", tpu_fails=NO_KERNEL)
    _, text = _detect_warning(AUTO, probe, caplog)
    assert "the installed TensorFlow (tensorflow 2.21.0) is a CPU-only build" in text
    assert ("Fix: install JAX for this TPU (pip install 'jax[tpu]') and import fenwicks in a "
            "new Python process: it then runs on the jax engine. To train on TensorFlow "
            "instead, replace it with the TPU build (its newest release is 2.20.0): pip "
            "uninstall -y tensorflow, then pip install 'tensorflow-tpu==2.20.0'") in text
    _never_a_second_tensorflow(text)


def test_two_tensorflow_distributions_in_one_folder_are_named(caplog):
    probe = FakeProbe(evidence=["libtpu 0.0.52 is installed", "/dev/vfio/0 exists"],
                      tensorflows={"tensorflow": "2.20.0", "tensorflow-tpu": "2.20.0"},
                      libtpu_version="0.0.52", tpu_fails=NO_KERNEL)
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert acc.reason.startswith("auto-detection: two TensorFlow distributions share one "
                                 "folder here (see the WARNING); ")
    assert text == (
        "a TPU is on this machine (libtpu 0.0.52 is installed, /dev/vfio/0 exists) and "
        "tensorflow-tpu 2.20.0 is installed, but so is tensorflow 2.20.0: they install into "
        "one `tensorflow` folder, and the files that run (the last installed) have no TPU "
        "kernels (RuntimeError: TPUs not found in the cluster. Failed in initialization: No "
        "OpKernel was registered to support Op 'ConfigureDistributedTPU' used by {{node "
        "ConfigureDistributedTPU}}). Fix: pip uninstall -y tensorflow-tpu tensorflow, then "
        f"pip install 'tensorflow-tpu==2.20.0' -f {INDEX} (Google's instructions: the libtpu "
        "made for that TensorFlow; it replaces libtpu 0.0.52, which JAX or torch_xla here may "
        "be built against), and start a new Python process." + ON_CPU)
    _never_a_second_tensorflow(text)


@pytest.mark.parametrize("error", [
    "No TPU platform found. Platform manager status: OK",
    "libtpu version 0.0.52 is not compatible with this TensorFlow (expected 0.0.14)",
])
def test_a_tpu_tensorflow_with_a_libtpu_it_cannot_use(caplog, error):
    probe = FakeProbe(evidence=["TPU_ACCELERATOR_TYPE=v5litepod-8", "/dev/vfio/0 exists"],
                      tensorflows={"tensorflow-tpu": "2.20.0"}, libtpu_version="0.0.52",
                      jax="0.10.2", tpu_fails=RuntimeError(error))
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert acc.reason.startswith("auto-detection: tensorflow-tpu 2.20.0 cannot use libtpu "
                                 "0.0.52 here (see the WARNING); ")
    assert text == (
        "a TPU is on this machine (TPU_ACCELERATOR_TYPE=v5litepod-8, /dev/vfio/0 exists) and "
        "tensorflow-tpu 2.20.0 is installed, but it cannot use libtpu 0.0.52 (RuntimeError: "
        f"{error}): a TensorFlow TPU build works only with the libtpu made for it, and pip "
        "alone picks the newest libtpu, which is made for JAX. Fix: pip install "
        f"--force-reinstall 'tensorflow-tpu==2.20.0' -f {INDEX} (Google's instructions: the "
        "libtpu made for that TensorFlow; it replaces libtpu 0.0.52, which JAX or torch_xla "
        "here may be built against), then start a new Python process. Or run on the jax "
        "engine, which reaches this TPU through JAX 0.10.2 and the libtpu installed: set "
        "FENWICKS_ENGINE=jax before importing fenwicks, in a new Python process (the engine "
        "is chosen at import)." + ON_CPU)
    _never_a_second_tensorflow(text)


def test_a_tpu_that_jax_in_this_process_took_first(caplog):
    error = ("TPU initialization failed: The TPU is already in use by process with pid 4000. "
             "Not attempting to load libtpu.so in this process.")
    probe = FakeProbe(evidence=["libtpu 0.0.52 is installed", "/dev/vfio/0 exists"],
                      jax="0.10.2", jax_holds_tpu=True, tpu_fails=RuntimeError(error))
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert acc.reason.startswith("auto-detection: JAX in this process holds the TPU here ")
    assert text == (
        "a TPU is on this machine (libtpu 0.0.52 is installed, /dev/vfio/0 exists) but JAX in "
        f"this process already holds it (RuntimeError: {error}): a TPU serves one framework "
        "per process, and JAX initialised it first (jax.devices() or a JAX computation ran "
        "before Fenwicks). Fix: use the jax engine (FENWICKS_ENGINE=jax before importing "
        "fenwicks), or keep JAX off the TPU (JAX_PLATFORMS=cpu before importing jax); either "
        "way in a new Python process, since JAX keeps the TPU until its process ends."
        + ON_CPU)
    # The same error naming this process's pid is recognised without JAX's internals.
    _, again = _detect_warning(AUTO, FakeProbe(libtpu=True, tpu_fails=RuntimeError(error)),
                               caplog)
    assert "but JAX in this process already holds it" in again


def test_a_tpu_held_by_another_process_names_the_holder_and_no_restart(caplog):
    probe = FakeProbe(evidence=["libtpu 0.0.52 is installed", "/dev/accel0 exists"],
                      tpu_fails=BUSY,
                      tpu_holders=["pid 4242 (python3 -m ipykernel_launcher -f k.json)"])
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert acc.reason == ("auto-detection: another process holds the TPU here (see the "
                          "WARNING); no other TPU or GPU was found, so the CPU")
    assert text == (
        "a TPU is on this machine (libtpu 0.0.52 is installed, /dev/accel0 exists) but another "
        "process holds it: pid 4242 (python3 -m ipykernel_launcher -f k.json) (RuntimeError: "
        "TPU initialization failed: open(/dev/accel0): Device or resource busy: Device or "
        "resource busy; Couldn't open device: /dev/accel0). Fix: end that process (kill "
        "4242; if it is another notebook's kernel, stop that notebook's session); restarting "
        "this process alone does not free the TPU." + ON_CPU)
    unnamed = FakeProbe(evidence=["/dev/accel0 exists"], tpu_fails=BUSY)
    _, text = _detect_warning(AUTO, unnamed, caplog)
    assert text == (
        "a TPU is on this machine (/dev/accel0 exists) but another process holds it "
        "(RuntimeError: TPU initialization failed: open(/dev/accel0): Device or resource "
        "busy: Device or resource busy; Couldn't open device: /dev/accel0). Fix: find it with "
        "`lsof -w /dev/accel* /dev/vfio/*` (with sudo on a TPU VM) and end it with "
        "`kill <pid>`; restarting this process alone does not free the TPU." + ON_CPU)


def test_keras_backend_not_tensorflow_is_a_clear_error_at_import():
    # The fifth cause is decided at `import fenwicks` (engine choice), from the same fakes
    # of the machine the diagnosis reads: the whole message, one sentence.
    facts = _engine.HostFacts({"tensorflow-cpu": "2.20.0", "libtpu": "0.0.17"})
    with pytest.raises(_engine.EngineError) as failure:
        _engine.choose_engine({"KERAS_BACKEND": "torch", "ISTPUVM": "1"}, facts)
    assert str(failure.value) == (
        "KERAS_BACKEND=torch is set, but Fenwicks runs Keras only on TensorFlow or JAX; unset "
        "KERAS_BACKEND (or set it to tensorflow or jax) before importing fenwicks, in a new "
        "Python process.")


def test_on_the_jax_engine_a_tpu_image_without_a_chip_says_so(caplog):
    # The Kaggle TPU image replica (tools/platform_replicas.sh): JAX 0.7.2's own error.
    error = "UNKNOWN: TPU initialization failed: No ba16c7433 device found."
    probe = FakeJaxProbe("cpu", 1, evidence=KAGGLE, tensorflows={"tensorflow-cpu": "2.20.0"},
                         libtpu_version="0.0.17", jax="0.7.2", errors={"tpu": error})
    caplog.set_level(logging.WARNING, logger="fenwicks")
    with pytest.warns(accel.AcceleratorWarning) as caught:
        acc = jax_devices.detect_jax(AUTO, probe)
    assert (acc.engine, acc.kind) == ("jax", "cpu")
    assert acc.reason == ("auto-detection: no TPU chip is attached here (see the WARNING); "
                          "JAX sees no TPU or GPU, so the CPU")
    assert [str(w.message) for w in caught] == [acc.warnings[0]] == [
        "this machine is set up as a TPU host (ISTPUVM=1, TPU_PROCESS_ADDRESSES=local, libtpu "
        f"0.0.17 is installed) but no TPU chip is attached: libtpu found none ({error}), and "
        "there is no /dev/accel* or /dev/vfio/* device. Fix: choose a TPU runtime (Kaggle: "
        "Settings > Accelerator; Colab: Runtime > Change runtime type); on a copy of a TPU "
        "image without a TPU (a CPU session, a replica) this is expected." + ON_CPU]


@pytest.mark.parametrize("errors,cause", [
    ({}, "but JAX 0.10.2 has no TPU backend: libtpu is not installed for it. Fix: pip "
         "install 'jax[tpu]'"),
    ({"tpu": "INTERNAL: The TPU is already in use by process with pid 4242."},
     "but another process holds it (INTERNAL: The TPU is already in use by process with pid "
     "4242.). Fix: find it with `lsof"),
    ({"tpu": "INTERNAL: The TPU is already in use by process with pid 4000."},
     "but TensorFlow in this process already holds the TPU"),
    ({"tpu": "Unexpected PJRT_Plugin_Attributes_Args size: the plugin is built with a later "
             "PJRT API version"},
     "but JAX 0.10.2 cannot use libtpu 0.0.17 (Unexpected PJRT_Plugin_Attributes_Args size"),
])
def test_on_the_jax_engine_each_tpu_cause_has_its_fix(errors, cause):
    probe = FakeJaxProbe("cpu", 1, evidence=["libtpu 0.0.17 is installed", "/dev/vfio/0 exists"],
                         libtpu_version="0.0.17", jax="0.10.2", errors=errors)
    with pytest.warns(accel.AcceleratorWarning):
        acc = jax_devices.detect_jax(AUTO, probe)
    assert cause in acc.warnings[0]


def test_a_failed_tpu_with_a_working_gpu_says_the_gpu_was_chosen(caplog):
    acc, text = _detect_warning(AUTO, FakeProbe(libtpu=True, tpu_fails=BUSY, gpus=[V100]),
                                caplog)
    assert acc.kind == "gpu"
    assert acc.reason == ("auto-detection: another process holds the TPU here (see the "
                          "WARNING); TensorFlow sees one GPU, so it trains alone")
    assert text.endswith("Fenwicks chose the GPU (1 replica, float16) instead.")


def test_an_nvidia_gpu_with_the_cpu_only_wheel(caplog):
    probe = FakeProbe(nvidia="/proc/driver/nvidia exists",
                      build={"is_cuda_build": False, "cuda_version": None,
                             "cudnn_version": None})
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert acc.kind == "cpu"
    assert text.startswith("an NVIDIA GPU is on this machine (/proc/driver/nvidia exists) but "
                           "TensorFlow lists no GPU: the installed TensorFlow is built "
                           "without CUDA (the CPU-only wheel")
    assert "pip uninstall -y tensorflow-cpu, then pip install 'fenwicks[gpu]'" in text
    assert text.endswith("Fenwicks chose the CPU (1 replica, float32) instead.")


def test_an_nvidia_gpu_with_a_cuda_mismatch_names_the_library_that_failed(caplog):
    probe = FakeProbe(nvidia="nvidia-smi lists GPU 0: Tesla T4 (UUID: GPU-1)",
                      cuda_error=NO_CUDNN)
    _, text = _detect_warning(AUTO, probe, caplog)
    assert "(nvidia-smi lists GPU 0: Tesla T4 (UUID: GPU-1))" in text
    assert f"TensorFlow was built for CUDA 12.5.1 and cuDNN 9, and loading them failed: " \
           f"{NO_CUDNN}" in text
    assert "match the CUDA and cuDNN versions to TensorFlow's" in text


def test_nothing_present_means_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", accel.AcceleratorWarning)
        acc = tf_devices.detect(AUTO, FakeProbe(), env={})
    assert acc.kind == "cpu" and acc.warnings == ()


@pytest.mark.parametrize("device,probe,cause", [
    ("tpu", FakeProbe(libtpu=True, tpu_fails=BUSY), "Device or resource busy"),
    ("gpu", FakeProbe(nvidia="/dev/nvidia0 exists", cuda_error=NO_CUDNN), NO_CUDNN),
    ("gpu", FakeProbe(nvidia="/dev/nvidia0 exists", build={"is_cuda_build": False}),
     "built without CUDA"),
])
def test_an_insisted_device_fails_with_the_original_cause(device, probe, cause):
    request = accel.Request(device, source=f"FENWICKS_DEVICE={device}")
    with pytest.raises(accel.AcceleratorError) as failure:
        tf_devices.detect(request, probe, env={})
    message = str(failure.value)
    assert message.startswith(f"device={device!r} was requested (FENWICKS_DEVICE={device}) "
                              "but cannot be used: ")
    assert cause in message and "Fix:" in message


def test_info_and_the_cli_show_the_warning(accel_state, capsys):
    from fenwicks import __main__ as cli
    from fenwicks import report

    with pytest.warns(accel.AcceleratorWarning):
        acc = tf_devices.detect(AUTO, FakeProbe(libtpu=True, tpu_fails=BUSY), env={})
    accel_state(acc)
    assert ("WARNING", acc.warnings[0]) in report.info_rows()
    assert cli.main(["info"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("WARNING")]
    assert len(lines) == 1 and lines[0].split(None, 1)[1] == acc.warnings[0]


# ------------------------------------------------------------------ the real probes


def test_nvidia_smi_listing_a_gpu_is_evidence(tmp_path, monkeypatch):
    monkeypatch.setattr(_host, "NVIDIA_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert accel.nvidia_device_evidence() is None  # no nvidia-smi on PATH
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    assert accel.nvidia_device_evidence() is None  # nvidia-smi without a GPU (a driver only)
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1234)'\n")
    assert accel.nvidia_device_evidence() == "nvidia-smi lists GPU 0: Tesla T4 (UUID: GPU-1234)"
    monkeypatch.setattr(_host, "NVIDIA_PATHS", (str(tmp_path),))
    assert accel.nvidia_device_evidence() == f"{tmp_path} exists"


def test_tpu_holders_are_found_in_proc(tmp_path, monkeypatch):
    device = tmp_path / "accel0"
    device.write_text("")
    monkeypatch.setattr(_host, "TPU_DEVICE_RE", re.compile("^" + re.escape(str(device)) + "$"))
    holder = subprocess.Popen([sys.executable, "-c",
                               f"f = open({str(device)!r}); import time; time.sleep(60)"])
    try:
        for _ in range(100):  # until the holder has opened the file
            holders = tf_devices.TFProbe().tpu_holders()
            if holders:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(holders) == 1 and holders[0].startswith(f"pid {holder.pid} (")
        assert sys.executable in holders[0]
    finally:
        holder.kill()
        holder.wait()


# The import fails at the TensorFlow check; sys.modules[...] = None makes TF unimportable.
_NO_TF = """
import sys
sys.modules['tensorflow'] = None
try:
    import fenwicks
except ImportError as err:
    print(err)
else:
    raise SystemExit('imported without TensorFlow')
"""


@pytest.mark.parametrize("machine,extra,reason", [
    ("tpu", "tpu", "this is a TPU host (libtpu is installed)"),
    ("gpu", "gpu", "an NVIDIA GPU is present (nvidia-smi lists GPU 0: Tesla T4 (UUID: x))"),
    ("cpu", "cpu", "no TPU (libtpu) and no NVIDIA GPU was found"),
])
def test_import_without_tensorflow_names_this_machines_extra(tmp_path, machine, extra, reason):
    if accel.libtpu_present() or accel.nvidia_device_evidence():
        pytest.skip("this machine has a real TPU or GPU; the fakes cannot hide it")
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    if machine == "tpu":  # what pip install libtpu leaves: an importable libtpu package
        (site / "libtpu").mkdir()
        (site / "libtpu" / "__init__.py").write_text("")
    if machine == "gpu":
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: x)'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = run_python(_NO_TF, env=env).stdout
    assert out.startswith("Fenwicks needs TensorFlow 2.20 or 2.21")
    assert f"On this machine {reason}: pip install 'fenwicks[{extra}]'" in out


_DETECT_TWICE = """
from fenwicks import accel
from fenwicks.train.tf import devices as tf_devices
from tests.test_accel import FakeProbe
from tests.test_platforms import KAGGLE, NO_KERNEL
for _ in range(2):  # detection again (a reset, configure): the diagnosis is not repeated
    tf_devices.detect(accel.Request(), FakeProbe(libtpu=True, evidence=KAGGLE,
                                            tensorflows={"tensorflow-cpu": "2.20.0"},
                                            libtpu_version="0.0.17", tpu_fails=NO_KERNEL),
                 env={})
"""


def test_a_diagnosis_is_shown_once_per_process_without_a_source_line():
    proc = run_python(_DETECT_TWICE, cwd=ROOT)
    shown = [line for line in proc.stderr.splitlines() if "a TPU is on this machine" in line]
    assert len(shown) == 1, proc.stderr
    assert shown[0].startswith("fenwicks:0: AcceleratorWarning: a TPU is on this machine (")
    after = proc.stderr.splitlines()[proc.stderr.splitlines().index(shown[0]) + 1:]
    assert not any(line.startswith("  ") for line in after), proc.stderr  # no source line
