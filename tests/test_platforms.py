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

from fenwicks import accel
from tests.conftest import ROOT, run_python
from tests.test_accel import V100, FakeProbe

AUTO = accel._Request()
BUSY = RuntimeError("TPU initialization failed: open(/dev/accel0): Device or resource busy: "
                    "Device or resource busy; Couldn't open device: /dev/accel0")
MISMATCH = RuntimeError("libtpu version 0.0.21 is not compatible with this TensorFlow "
                        "(expected 0.0.17)")
NO_CUDNN = "libcudnn.so.9: cannot open shared object file: No such file or directory"


def _detect_warning(request, probe, caplog):
    """Detects; returns (accelerator, the one AcceleratorWarning text, the log text)."""
    caplog.set_level(logging.WARNING, logger="fenwicks")
    with pytest.warns(accel.AcceleratorWarning) as caught:
        acc = accel.detect(request, probe, env={})
    texts = [str(w.message) for w in caught if w.category is accel.AcceleratorWarning]
    assert len(texts) == 1, texts
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert logged == [f"fenwicks: {texts[0]}"]
    assert acc.warnings == (texts[0],)
    return acc, texts[0]


def test_a_tpu_held_by_another_process_is_a_warning_naming_holder_and_fix(caplog):
    probe = FakeProbe(libtpu=True, tpu_fails=BUSY,
                      tpu_holders=["pid 4242 (python3 -m ipykernel_launcher -f k.json)"])
    acc, text = _detect_warning(AUTO, probe, caplog)
    assert (acc.kind, acc.num_replicas, acc.precision) == ("cpu", 1, "float32")
    assert text.startswith("a TPU is on this machine (libtpu is installed) but could not be "
                           "initialised: RuntimeError: TPU initialization failed: "
                           "open(/dev/accel0): Device or resource busy")
    assert "It is held by pid 4242 (python3 -m ipykernel_launcher -f k.json)." in text
    assert "restart the runtime (Colab/Kaggle: Runtime > Restart session)" in text
    assert "`lsof -w /dev/accel* /dev/vfio/*`, then `kill <pid>`" in text
    assert text.endswith("Fenwicks chose the CPU (1 replica, float32) instead.")


def test_a_tpu_version_mismatch_names_the_tpu_extra(caplog):
    _, text = _detect_warning(AUTO, FakeProbe(libtpu=True, tpu_fails=MISMATCH), caplog)
    assert "libtpu version 0.0.21 is not compatible" in text
    assert "pip install 'fenwicks[tpu]'" in text and "held by" not in text


def test_a_failed_tpu_with_a_working_gpu_says_the_gpu_was_chosen(caplog):
    acc, text = _detect_warning(AUTO, FakeProbe(libtpu=True, tpu_fails=BUSY, gpus=[V100]),
                                caplog)
    assert acc.kind == "gpu"
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
        acc = accel.detect(AUTO, FakeProbe(), env={})
    assert acc.kind == "cpu" and acc.warnings == ()


@pytest.mark.parametrize("device,probe,cause", [
    ("tpu", FakeProbe(libtpu=True, tpu_fails=BUSY), "Device or resource busy"),
    ("gpu", FakeProbe(nvidia="/dev/nvidia0 exists", cuda_error=NO_CUDNN), NO_CUDNN),
    ("gpu", FakeProbe(nvidia="/dev/nvidia0 exists", build={"is_cuda_build": False}),
     "built without CUDA"),
])
def test_an_insisted_device_fails_with_the_original_cause(device, probe, cause):
    request = accel._Request(device, source=f"FENWICKS_DEVICE={device}")
    with pytest.raises(accel.AcceleratorError) as failure:
        accel.detect(request, probe, env={})
    message = str(failure.value)
    assert message.startswith(f"device={device!r} was requested (FENWICKS_DEVICE={device}) "
                              "but cannot be used: ")
    assert cause in message and "Fix:" in message


def test_info_and_the_cli_show_the_warning(monkeypatch, capsys):
    from fenwicks import __main__ as cli
    from fenwicks import report

    with pytest.warns(accel.AcceleratorWarning):
        acc = accel.detect(AUTO, FakeProbe(libtpu=True, tpu_fails=BUSY), env={})
    monkeypatch.setattr(accel, "_current", acc)
    assert ("WARNING", acc.warnings[0]) in report.info_rows()
    assert cli.main(["info"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("WARNING")]
    assert len(lines) == 1 and lines[0].split(None, 1)[1] == acc.warnings[0]


# ------------------------------------------------------------------ the real probes


def test_nvidia_smi_listing_a_gpu_is_evidence(tmp_path, monkeypatch):
    monkeypatch.setattr(accel, "_NVIDIA_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert accel.nvidia_device_evidence() is None  # no nvidia-smi on PATH
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    assert accel.nvidia_device_evidence() is None  # nvidia-smi without a GPU (a driver only)
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1234)'\n")
    assert accel.nvidia_device_evidence() == "nvidia-smi lists GPU 0: Tesla T4 (UUID: GPU-1234)"
    monkeypatch.setattr(accel, "_NVIDIA_PATHS", (str(tmp_path),))
    assert accel.nvidia_device_evidence() == f"{tmp_path} exists"


def test_tpu_holders_are_found_in_proc(tmp_path, monkeypatch):
    device = tmp_path / "accel0"
    device.write_text("")
    monkeypatch.setattr(accel, "_TPU_DEVICE_RE", re.compile("^" + re.escape(str(device)) + "$"))
    holder = subprocess.Popen([sys.executable, "-c",
                               f"f = open({str(device)!r}); import time; time.sleep(60)"])
    try:
        for _ in range(100):  # until the holder has opened the file
            holders = accel._TFProbe().tpu_holders()
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
    ("tpu", "tpu", "libtpu is installed, so this is a TPU VM"),
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
