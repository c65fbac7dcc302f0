"""One truth for replicas and processes, the engine's, proven across two processes on
loopback: ``jax.distributed`` with 4 host devices each (8 replicas), and TensorFlow's
`MultiWorkerMirroredStrategy` from ``TF_CONFIG`` (TensorFlow gives each CPU worker one
replica: ``CollectiveAllReduceExtended._initialize_local_devices`` counts GPUs or TPUs
and otherwise takes the worker's CPU alone, so 2 replicas). On both, every shared reader
divides the global batch by the global replica count, never by this process's devices:
``params['batch_size']`` of training, evaluation and `find_lr`, the exact evaluation's
example count, the LR finder's batches read per process, and the recorded ``trn_bs``
(`tests._engine_counts` runs each process).
"""

from __future__ import annotations

import concurrent.futures
import json
import socket

import pytest

from tests import _engine_counts as counts
from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(commands: list[tuple[list[str], dict]]) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(run_process, args, env, timeout=600) for args, env in commands]
        return [last_json(job.result().stdout) for job in jobs]


def _jax_pair(tmp_path) -> list[dict]:
    port = str(_free_port())
    env = {"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4 "
                        "--xla_backend_optimization_level=0"}
    return _pair([(["-m", "tests._engine_counts", str(tmp_path / "run"), port, "2",
                    str(index)], env) for index in range(2)])


def _tf_pair(tmp_path) -> list[dict]:
    workers = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    commands = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        commands.append((["-m", "tests._engine_counts", str(tmp_path / "run")],
                         {"FENWICKS_DEVICE": "auto", "TF_CONFIG": json.dumps(config)}))
    return _pair(commands)


def _check(results: list[dict], engine: str, replicas: int, processes: int) -> None:
    local = replicas // processes
    for index, result in enumerate(results):
        assert result["engine"] == engine
        # The Accelerator's count and the engine's agree: the global one.
        assert result["acc_replicas"] == replicas
        assert result["config"] == [replicas, processes]
        # Training: each process's pipeline gets the per-replica batch of the global one,
        # and its share of the input (InputContext(P, p, R)).
        train = result["train"][-1]
        assert (train["batch_size"], train["global_batch_size"], train["num_replicas"]) == \
            (counts.TRN_BS // replicas, counts.TRN_BS, replicas)
        assert train["context"] == [processes, index, replicas]
        # Exact evaluation: per-replica batches of the global val_bs, every example once.
        assert {e["batch_size"] for e in result["eval"]} == {counts.VAL_BS // replicas}
        assert result["num_examples"] == counts.NUM_EVAL
        # The LR finder: the same per-replica batch as the estimator would give, one
        # per local replica a step from this process's pipeline, all steps run.
        sweep = result["find_lr"][-1]
        assert (sweep["batch_size"], sweep["num_replicas"]) == (counts.LR_BS // replicas,
                                                                replicas)
        assert result["lr_steps"] == counts.LR_STEPS
        assert result["lr_batches"] == counts.LR_STEPS * local
        # The run record holds the global training batch the input position counts in.
        assert result["recorded_trn_bs"] == counts.TRN_BS


def test_jax_two_processes_of_four_devices_count_eight_replicas_everywhere(tmp_path):
    _check(_jax_pair(tmp_path), "jax", replicas=8, processes=2)


def test_tf_two_workers_count_the_strategy_replicas_everywhere(tmp_path):
    _check(_tf_pair(tmp_path), "tf", replicas=2, processes=2)
