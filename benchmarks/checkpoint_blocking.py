"""How long does a checkpoint save block the training loop, synchronous vs asynchronous?

`fw.models.resnet9` at full width (c=64: 6.57M parameters, plus SGD momentum slots and
BatchNorm statistics: a ~53 MB checkpoint) trains on random CIFAR-shaped batches through
the estimator with a save after every compiled loop (``save_every_loops=1``), once with
``async_checkpoints=False`` and once with the default ``True``, and once without saves
during training. For each storage it prints the seconds `Checkpointer.save` blocked the
training thread per save (its own `last_blocked_secs`: a synchronous save writes the files,
an asynchronous one copies the variables to host memory and waits for the previous write),
the ratio async / sync, and the training steps/s of each run against the run without saves.

A second synchronous run ("sync A/A") is the A/A control: its blocked seconds over the
first's show how much the machine's load alone moves a figure in the same run. Each row
also gives the bytes of its newest checkpoint. The script times whichever checkpointer
the checkout has (the run format's, or the engines' own before it), so the same file,
copied into an older checkout, measures that code.

Targets (issue #22): async blocks at most 20% of sync's time on gs://, and steps/s with a
save every loop is within 10% of the run without saves.

    python benchmarks/checkpoint_blocking.py                    # local disk and gs://
    python benchmarks/checkpoint_blocking.py --storage local
    python benchmarks/checkpoint_blocking.py --latency 0.05     # + 50 ms per gs:// request
    python benchmarks/checkpoint_blocking.py --engine jax       # the JAX engine

gs:// goes through the GCS emulator of the tests (`tests/gcs_emulator.py`: needs root
and ``ip netns``), with a fault proxy delaying every request by ``--latency`` seconds.
The emulator is a Python server on the same machine: it takes CPU time from training
while it stores a checkpoint, which a real bucket would not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's fenwicks (and tests/ for the emulator)
from benchmarks import _results  # noqa: E402

BLOCKED_TARGET = 0.20  # async / sync blocked seconds per save, on gs://
STEPS_TARGET = 0.10  # steps/s with a save every loop vs without saves
# "sync A/A": a second synchronous run, the same as "sync": the spread between the two
# is what load alone does to a figure in this run.
MODES = ("no saves", "sync", "sync A/A", "async")


def _estimator(work_dir: str, mode: str, steps_per_loop: int, batch_size: int,
               width: int = 64):
    import fenwicks as fw

    opt_func = fw.train.sgd_optimizer(0.01, mom=0.9, wd=5e-4)
    model_func = fw.train.get_clf_model_func(lambda: fw.models.resnet9(c=width), opt_func)
    return fw.train.get_tpu_estimator(
        100, model_func, work_dir, trn_bs=batch_size, steps_per_loop=steps_per_loop,
        save_every_loops=None if mode == "no saves" else 1, save_every_secs=None,
        async_checkpoints=mode == "async", seed=1, verbose=False)


# The checkpointers whose `save` is timed: the run format's, and (to measure the code
# before it with this same script) the TensorFlow engine's and the JAX engine's own.
CHECKPOINTERS = (("fenwicks.train.run_format", "RunCheckpointer"),
                 ("fenwicks.train.tf.checkpointer", "SyncCheckpointer"),
                 ("fenwicks.train.jax.checkpoints", "OrbaxCheckpointer"))


def _checkpointer_classes() -> list[type]:
    import importlib

    found = []
    for module, name in CHECKPOINTERS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue  # not in this checkout, or not importable on this engine
    return found


def _blocked_seconds() -> tuple[list[float], object]:
    """Records the checkpointer's own measure of each save that wrote (or started) one
    (``last_blocked_secs``; a save nested in another, as a subclass's, counts once)."""
    blocked: list[float] = []
    originals = {cls: cls.save for cls in _checkpointer_classes()}
    depth = [0]

    def timed(original):
        def save(self, step: int, *, force: bool = False) -> None:
            depth[0] += 1
            try:
                original(self, step, force=force)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and self.last_blocked_secs is not None:  # None: nothing new
                blocked.append(self.last_blocked_secs)
        return save

    for cls, original in originals.items():
        cls.save = timed(original)

    def restore() -> None:
        for cls, original in originals.items():
            cls.save = original

    return blocked, restore


def _step_bytes(work_dir: str) -> int:
    """Bytes of the newest checkpoint in `work_dir`: a run-format step
    (``checkpoints/<step>``), or the formats before it (TensorFlow's ``ckpt-<step>.*``,
    the JAX engine's ``orbax/<step>``)."""
    import glob

    def size(paths) -> int:
        return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))

    for folder in ("checkpoints", "orbax"):
        steps = [int(name) for name in (os.listdir(os.path.join(work_dir, folder))
                                        if os.path.isdir(os.path.join(work_dir, folder))
                                        else ()) if name.isdigit()]
        if steps:
            return size(glob.glob(os.path.join(work_dir, folder, str(max(steps)), "**"),
                                  recursive=True))
    indexes = glob.glob(os.path.join(work_dir, "ckpt-*.index"))
    if not indexes:
        return 0
    newest = max(indexes, key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
    return size(glob.glob(newest[:-len(".index")] + ".*"))


def measure(work_root: str, loops: int, steps_per_loop: int, batch_size: int,
            repeats: int, width: int = 64) -> list[dict]:
    """One row per mode: saves, blocked seconds per save, steps/s (the best of `repeats`
    timed `train` calls: other processes on the machine only ever slow a run down)."""
    import fenwicks as fw

    rng = np.random.default_rng(0)
    x = rng.random((batch_size * 8, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, batch_size * 8).astype(np.int32)
    train_fn = lambda params: fw.data.numpy_ds(x, y, params["batch_size"], seed=1)  # noqa: E731
    work_dirs = {mode: f"{work_root}/{mode.replace(' ', '-').replace('/', '')}"
                 for mode in MODES}
    estimators = {mode: _estimator(work_dirs[mode], mode, steps_per_loop, batch_size, width)
                  for mode in MODES}
    for est in estimators.values():
        est.train(train_fn, steps=steps_per_loop)  # compiles, and the first checkpoint
    blocked: dict[str, list[float]] = {mode: [] for mode in MODES}
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode, est in estimators.items():  # interleaved: load changes hit every mode
            saves, restore = _blocked_seconds()
            start = time.perf_counter()
            try:
                est.train(train_fn, steps=loops * steps_per_loop)  # ends with a whole save
            finally:
                restore()
            seconds[mode].append(time.perf_counter() - start)
            blocked[mode] += saves[:loops] if mode != "no saves" else []
    rows = []
    for mode, est in estimators.items():
        est.close()
        rows.append({"mode": mode, "saves": len(blocked[mode]),
                     "blocked_s": round(statistics.mean(blocked[mode]), 4)
                     if blocked[mode] else 0.0,
                     "blocked_max_s": round(max(blocked[mode], default=0.0), 4),
                     "steps_per_s": round(loops * steps_per_loop / min(seconds[mode]), 3),
                     "checkpoint_bytes": _step_bytes(work_dirs[mode])})
    return rows


def report(storage: str, rows: list[dict]) -> dict:
    import fenwicks as fw

    engine = fw.train.engines.current().name
    by = {r["mode"]: r for r in rows}
    base = by["no saves"]["steps_per_s"]
    print(f"\n{storage}, {engine} engine: resnet9, a save after every loop")
    print(f"{'mode':<9} {'saves':>5} {'blocked s/save':>15} {'max s':>7} {'steps/s':>8} "
          f"{'vs no saves':>12} {'bytes/step':>11}")
    for r in rows:
        print(f"{r['mode']:<9} {r['saves']:>5} {r['blocked_s']:>15.3f} "
              f"{r['blocked_max_s']:>7.3f} {r['steps_per_s']:>8.3f} "
              f"{r['steps_per_s'] / base:>11.2f}x {r['checkpoint_bytes']:>11}")
    ratio = by["async"]["blocked_s"] / by["sync"]["blocked_s"]
    control = by["sync A/A"]["blocked_s"] / by["sync"]["blocked_s"]
    slowdown = 1 - by["async"]["steps_per_s"] / base
    print(f"blocked per save, async / sync: {ratio:.3f} (target <= {BLOCKED_TARGET}); "
          f"A/A control, sync / sync: {control:.3f}; steps/s with an async save every "
          f"loop: {1 - slowdown:.2f}x of without saves (target >= {1 - STEPS_TARGET:.2f}x)")
    return {"storage": storage, "engine": engine, "rows": rows,
            "async_over_sync": round(ratio, 4), "aa_sync_over_sync": round(control, 4),
            "async_slowdown": round(slowdown, 4),
            "checkpoint_bytes": by["sync"]["checkpoint_bytes"]}


def _on_gcs(args: argparse.Namespace) -> dict:
    """Starts the emulator (and the proxy for latency), runs `--inside` in its namespace."""
    from tests import gcs_emulator

    with tempfile.TemporaryDirectory() as tmp:
        emulator = gcs_emulator.start(tmp, faults=args.latency > 0)
        try:
            command = [sys.executable, os.path.abspath(__file__), "--inside",
                       emulator.url("bench", f"run-{os.getpid()}"), "--loops",
                       str(args.loops), "--repeats", str(args.repeats),
                       "--steps-per-loop", str(args.steps_per_loop),
                       "--batch-size", str(args.batch_size), "--latency", str(args.latency),
                       "--width", str(args.width)]
            done = subprocess.run(["ip", "netns", "exec", emulator.namespace, *command],
                                  env={**os.environ, **emulator.env}, cwd=ROOT,
                                  capture_output=True, text=True, check=False)
        finally:
            emulator.stop()
    if done.returncode != 0:
        raise SystemExit(f"the gs:// run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=("both", "local", "gs"), default="both")
    parser.add_argument("--loops", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps-per-loop", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=64,
                        help="resnet9's c (64: full width; smaller for a smoke run)")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds added to every gs:// request")
    parser.add_argument("--engine", choices=("tf", "jax"), default=None,
                        help="the engine (KERAS_BACKEND); default: Fenwicks' choice")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the gs:// run, in the netns
    _results.add_option(parser)
    args = parser.parse_args(argv)
    if args.engine:  # before fenwicks is imported (the gs:// child inherits it)
        os.environ["KERAS_BACKEND"] = {"tf": "tensorflow", "jax": "jax"}[args.engine]
    if args.inside:
        if args.latency > 0:
            from tests import _fault_proxy

            _fault_proxy.set_rules([{"fault": "delay", "seconds": args.latency}])
        rows = measure(args.inside, args.loops, args.steps_per_loop, args.batch_size,
                       args.repeats, args.width)
        print(json.dumps(rows))
        return 0
    results = []
    if args.storage in ("both", "local"):
        with tempfile.TemporaryDirectory() as tmp:
            rows = measure(tmp, args.loops, args.steps_per_loop, args.batch_size,
                           args.repeats, args.width)
        results.append(report("local disk", rows))
    if args.storage in ("both", "gs"):
        label = "gs:// (emulator" + (f", +{args.latency:g} s per request)"
                                     if args.latency else ")")
        results.append(report(label, _on_gcs(args)))
    print(json.dumps(results))
    gcs = [r for r in results if r["storage"].startswith("gs://")]
    if args.results:
        _results.write(__file__, "resnet9 c=64, a save after every loop: seconds each save "
                       "blocks training, async vs sync", [
                           {key: value for key, value in r.items() if key != "rows"}
                           for r in results], argv,
                       summary=f"target: async/sync blocked per save <= {BLOCKED_TARGET}")
    return 0 if all(r["async_over_sync"] <= BLOCKED_TARGET for r in gcs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
