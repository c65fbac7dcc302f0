"""AutoGraph's conversions of Fenwicks' step functions, done once in the fork server.

A TensorFlow process converts ~38 Fenwicks functions (the training, evaluation and
prediction loops, the loss, the optimizer's update, the input's padding) the first time
it traces them: ~1.5-2.5 s of CPU, which every child of `tests._zygote` paid again
(measured 2026-11-26 under load: a child training mnist_net for a step, evaluating and
predicting, 4.96 -> 2.28 s). AutoGraph caches a conversion by the function's code object
and its conversion options, so conversions made in the server are found by every child.

Which functions: a scout, forked from the server, trains, evaluates and predicts a tiny
model on one CPU through Fenwicks' public API and reports each conversion it made (the
scout's TensorFlow runtime dies with it; the server's stays uninitialised, so a child
still chooses its devices). The server then converts the same code objects with the same
options. A conversion depends on the code and the options, not on the values a closure
holds (AutoGraph's own cache assumes as much), so the function converted here has empty
cells: 38 of 38 generated sources were identical to a child's own (checked 2026-11-26).

The first server of a test session runs the scout; the others read its report from the
file `LISTING_ENV` names. Anything that goes wrong only costs the speed-up: children
convert for themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import signal
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from typing import Any


def warm(directory: str) -> int:
    """Converts in this process what the scout converted; returns how many functions.

    The generated modules are written under `directory` (the server's private one) and
    kept there: AutoGraph would otherwise delete them at the first child's exit.
    """
    entries = _listed()
    from tensorflow.python.autograph.core import converter
    from tensorflow.python.autograph.impl import api

    done = 0
    register, tempdir = atexit.register, tempfile.tempdir
    atexit.register, tempfile.tempdir = (lambda func, *a, **k: func), directory
    try:
        for module, qualname, line, options in entries:
            function = _function(module, qualname, line)
            if function is None:
                continue
            with contextlib.suppress(Exception):
                api._convert_actual(function, converter.ProgramContext(  # noqa: SLF001
                    options=converter.ConversionOptions(
                        recursive=options[0], user_requested=options[1],
                        internal_convert_user_code=options[2], optional_features=())))
                done += 1
    finally:
        atexit.register, tempfile.tempdir = register, tempdir
    return done


# A file (set by tests/conftest.py, one per test session) holding the scout's report:
# the first server of a session runs the scout (~4.5 s of CPU), the others read it.
LISTING_ENV = "FENWICKS_TEST_AUTOGRAPH_LISTING"
SCOUT_TIMEOUT = 180  # seconds; the scout takes ~5 on a quiet machine


def _listed() -> list[list[Any]]:
    """The scout's report: from the session's file if a server already wrote it."""
    path = os.environ.get(LISTING_ENV)
    if path:
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                return json.load(f)
    entries = _scout()
    if path and entries:
        with contextlib.suppress(OSError):
            with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path),
                                             delete=False) as f:
                json.dump(entries, f)
            os.replace(f.name, path)  # whole or absent, for servers starting meanwhile
    return entries


def _scout() -> list[list[Any]]:
    """[module, qualname, first line, options] of each Fenwicks function a forked child
    converted while training, evaluating and predicting."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the scout: never returns
        os.close(read)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            with tempfile.TemporaryDirectory() as work_dir:
                os.write(write, json.dumps(_recorded(_tiny_run, work_dir)).encode())
        finally:
            os._exit(0)
    os.close(write)
    data, deadline = b"", time.monotonic() + SCOUT_TIMEOUT
    try:
        while select.select([read], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            data += chunk
        else:  # out of time (a busy machine): the server starts without the warm-up
            os.kill(pid, signal.SIGKILL)
            data = b""
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return json.loads(data) if data else []


def _tiny_run(work_dir: str) -> None:
    import numpy as np

    import fenwicks as fw

    os.environ["FENWICKS_DEVICE"] = "cpu"
    x = np.random.default_rng(0).normal(size=(16, 8, 8, 1)).astype(np.float32)
    y = (np.arange(16) % 4).astype(np.int32)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=4, input_shape=(8, 8, 1)),
        fw.train.sgd_optimizer(0.01, mom=0.9, wd=5e-4))
    est = fw.train.get_tpu_estimator(2, model_func, work_dir, trn_bs=8, verbose=False)
    est.train(lambda params: fw.data.numpy_ds(x, y, params["batch_size"], seed=1), steps=2)
    evaluation = lambda params: fw.data.numpy_ds(x, y, params["batch_size"], training=False)
    est.evaluate(evaluation)
    est.predict(evaluation)


def _recorded(run: Any, *args: Any) -> list[list[Any]]:
    from tensorflow.python.autograph.pyct import transpiler

    original = transpiler.PyToPy.transform_function
    seen: list[list[Any]] = []

    def recording(self: Any, fn: Any, ctx: Any) -> Any:
        options = self.get_caching_key(ctx)
        code = getattr(fn, "__code__", None)
        if code is not None and str(getattr(fn, "__module__", "")).startswith("fenwicks") \
                and not self._cache.has(fn, options) and not options.optional_features:
            seen.append([fn.__module__, code.co_qualname, code.co_firstlineno,
                         list(options.as_tuple()[:3])])
        return original(self, fn, ctx)

    transpiler.PyToPy.transform_function = recording
    try:
        run(*args)
    finally:
        transpiler.PyToPy.transform_function = original
    return seen


def _function(module: str, qualname: str, line: int) -> types.FunctionType | None:
    """A function of that code object, its closure cells empty (None if not found)."""
    try:
        mod = sys.modules.get(module) or importlib.import_module(module)
    except ImportError:
        return None
    for top in _functions_of(mod):
        for code in _codes(top.__code__):
            if code.co_qualname == qualname and code.co_firstlineno == line:
                cells = tuple(types.CellType(None) for _ in code.co_freevars)
                function = types.FunctionType(code, top.__globals__, code.co_name, None,
                                              cells)
                function.__qualname__, function.__module__ = qualname, module
                return function
    return None


def _functions_of(mod: types.ModuleType) -> Iterator[types.FunctionType]:
    """The module's own functions and its classes' methods."""
    for value in list(vars(mod).values()):
        members = list(vars(value).values()) if isinstance(value, type) else [value]
        for member in members:
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(member, types.FunctionType) and \
                    member.__code__.co_filename == getattr(mod, "__file__", None):
                yield member


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)
