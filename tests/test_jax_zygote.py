"""JAX-engine test processes come from a fork server (`tests.conftest._JaxServer`) that
imported Fenwicks on JAX once; each child still reads its own ``XLA_FLAGS``, as a new
interpreter does, because nothing initialised JAX's backend before the fork."""

from __future__ import annotations

import json
import os

from tests import _zygote
from tests.conftest import start_process

_PROBE = """
import json, sys
import jax
jax.config.update("jax_enable_compilation_cache", False)  # XLA compiles: it dumps
jax.jit(lambda x: x + 1)(1.0)
print(json.dumps([jax.device_count(), jax.default_backend(), "fenwicks" in sys.modules]))
"""


def test_a_forked_jax_process_reads_its_own_xla_flags(tmp_path):
    dump = tmp_path / "dump"
    env = {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=3 --xla_dump_to={dump}"}
    proc = start_process(["-c", _PROBE], env)
    assert isinstance(proc, _zygote.ForkedProcess)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    # 3 devices: the child's flag, read when it first used JAX; Fenwicks already imported
    assert json.loads(out.strip().splitlines()[-1]) == [3, "cpu", True]
    # ...and XLA's other flags: it dumped the program it compiled where the child said
    assert any("jit__lambda" in name for name in os.listdir(dump)), os.listdir(dump)
