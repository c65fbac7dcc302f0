# %% [markdown]
# # Tutorial 8: CPU vs GPU vs TPU, measured
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 30 minutes: both settings, `'auto'` (the CPU here
#   too) and `'cpu'`, train 7 calls of 20 steps of a ResNet-9.
# - On a GPU or a TPU: not measured (none was available where this was written); the
#   `'cpu'` setting there still takes about 15 minutes on a host CPU like this one.
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   34 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# How much faster is the accelerator, really? Two measurements answer it:
#
# 1. **Matrix-multiply TFLOPS**: the raw arithmetic speed of each device, the number on
#    the datasheet, measured with one workload everywhere (a chain of N x N products).
# 2. **Training throughput**: examples per second of a real model (ResNet-9 on
#    CIFAR-sized images) through the Fenwicks estimator, input pipeline included.
#
# The gap between the two is what a real model loses to memory traffic, small layers and
# the input pipeline. Run this notebook on a CPU, a GPU and a TPU runtime and compare.

# %% [markdown]
# ## Parameters
#
# `DEVICES` lists the `FENWICKS_DEVICE` settings to measure: `'auto'` is whatever
# accelerator this runtime has, `'cpu'` forces the host CPU for comparison.

# %% tags=["parameters"]
SMOKE = False           # True: tiny sizes that finish in seconds (the test suite sets it)
BATCH_SIZE = 512        # global batch size of the throughput run
EPOCHS = 1              # epochs of N_EXAMPLES images per timed training call
LEARNING_RATE = 0.4     # per BATCH_SIZE examples; does not change the speed
WEIGHT_DECAY = 5e-4     # per example; does not change the speed
N_EXAMPLES = 10_240     # synthetic CIFAR-sized images for the throughput run
WIDTH = 64              # ResNet-9 channels (64 is DavidNet)
MATMUL_N = None         # matrix size; None: 2048 on a CPU, 8192 on a GPU or TPU
TRIALS = 5              # timed calls per measurement; the median is reported
DEVICES = ['auto', 'cpu']

# %%
MATMUL_REPEATS = None   # None: each device's default
if SMOKE:
    BATCH_SIZE, N_EXAMPLES, WIDTH, TRIALS, DEVICES = 32, 64, 8, 2, ['cpu']
    MATMUL_N, MATMUL_REPEATS = 256, 2

# %% [markdown]
# ## One process per device setting
#
# TensorFlow fixes its devices at start-up (see tutorial 3), so each setting runs the
# script below in a fresh process. It prints one JSON line with both measurements.
# Nothing in it is device-specific.

# %%
# %%writefile measure_device.py
import json
import statistics
import sys
import tempfile

import numpy as np
import tensorflow as tf

import fenwicks as fw

cfg = json.loads(sys.argv[1])
report = fw.bench.run(n=cfg['n'], repeats=cfg['repeats'], trials=cfg['trials'])

build_nn = lambda: fw.models.resnet9(n_classes=10, c=cfg['width'])
# Random images are as fast to train on as real ones: speed does not depend on content.
rng = np.random.default_rng(0)
X = rng.integers(0, 256, size=(cfg['examples'], 32, 32, 3), dtype=np.uint8)
y = rng.integers(0, 10, size=cfg['examples']).astype(np.int32)
to_float = lambda x: tf.cast(x, tf.float32) / 255.0
input_fn = lambda params: fw.data.numpy_ds(
    X, y, params['batch_size'], training=True, batch_transform=to_float,
    input_context=params.get('input_context'))
opt_func = fw.train.sgd_optimizer(cfg['lr'] / cfg['batch_size'], mom=0.9,
                                  wd=cfg['wd'] * cfg['batch_size'])
model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='sum')
# Time est.train: one cold call (building and compiling), one warm-up, then the timed calls,
# each running all its steps in one compiled loop. A fresh work_dir: a resumed run would
# time other steps.
steps, batch_size = cfg['steps'], cfg['batch_size']
with tempfile.TemporaryDirectory() as work_dir:
    est = fw.train.get_tpu_estimator(steps, model_func, work_dir, trn_bs=batch_size,
                                     steps_per_loop=steps, save_every_secs=None,
                                     verbose=False)
    [timing] = fw.bench.measure([lambda: est.train(input_fn, steps=steps)], cfg['trials'])
acc = fw.accel.current()
throughput = {'device': acc.kind + (f' x{acc.num_replicas}' if acc.num_replicas > 1 else ''),
              'precision': est.config.precision, 'batch_size': batch_size,
              'cold_seconds': timing.cold,
              'examples_per_second': steps * batch_size / statistics.median(timing.warm)}
print(json.dumps({'table': report.table(), 'bench': report.as_dict(),
                  'throughput': throughput}))

# %%
import json
import os
import subprocess
import sys


def measure(device):
    cfg = dict(n=MATMUL_N, repeats=MATMUL_REPEATS, trials=TRIALS, width=WIDTH,
               examples=N_EXAMPLES, batch_size=BATCH_SIZE, lr=LEARNING_RATE,
               wd=WEIGHT_DECAY, steps=max(1, EPOCHS * N_EXAMPLES // BATCH_SIZE))
    env = {**os.environ, 'FENWICKS_DEVICE': device, 'TF_CPP_MIN_LOG_LEVEL': '2'}
    proc = subprocess.run([sys.executable, 'measure_device.py', json.dumps(cfg)], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f'{device} failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


measured = {device: measure(device) for device in DEVICES}

# %% [markdown]
# ## Matrix multiply
#
# Each row: one device and dtype. *cold* includes tracing and compilation (large on a TPU,
# where XLA compiles the whole chain), *med TF* is the warm median, *x cpu* the speed-up
# over the CPU in float32, *%peak* the fraction of the theoretical peak. A GPU or TPU only
# reaches its peak in bfloat16 / float16, on large matrices: that is what they are
# built for.

# %%
for device, m in measured.items():
    print(f'=== FENWICKS_DEVICE={device}\n{m["table"]}\n')

# %%
import matplotlib.pyplot as plt

rows = {}
for device, m in measured.items():
    for r in m['bench']['results']:
        rows[f"{device}: {r['device']} {r['dtype']}"] = r['tflops']
fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1))
ax.barh(list(rows), list(rows.values()))
ax.set_xscale('log')
ax.set_xlabel('TFLOPS, warm median (log scale)')
ax.set_title('Chained N x N matrix products')
plt.show()

# %% [markdown]
# ## Training throughput
#
# Examples per second of ResNet-9 training through the estimator: one compiled loop per
# call, input pipeline and checkpoint included, median over the warm calls. The first
# (cold) call also builds and compiles the model: on a TPU that takes tens of seconds,
# which is why short runs look slow there.

# %%
for device, m in measured.items():
    t = m['throughput']
    print(f"{device:>5}: {t['device']:>8} ({t['precision']}), batch {t['batch_size']}: "
          f"{t['examples_per_second']:>9,.0f} examples/s warm, "
          f"cold call {t['cold_seconds']:.1f} s")

fig, ax = plt.subplots(figsize=(6, 0.5 * len(measured) + 1))
labels = [f"{m['throughput']['device']} ({d})" for d, m in measured.items()]
ax.barh(labels, [m['throughput']['examples_per_second'] for m in measured.values()])
ax.set_xlabel('training examples / s')
ax.set_title(f'ResNet-9 (width {WIDTH}), batch {BATCH_SIZE}')
plt.show()

# %% [markdown]
# Compare the speed-ups: the accelerator's matmul advantage over the CPU is usually far
# larger than its training advantage. Closing that gap is the work of tutorials 2 and 4:
# bigger batches, bfloat16, a fast input pipeline, and enough steps per compiled loop.
#
# The same measurements from a terminal: `python -m fenwicks bench`.
