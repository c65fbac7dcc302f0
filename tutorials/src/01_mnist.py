# %% [markdown]
# # Tutorial 1: MNIST, end to end
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 10 minutes (702 steps), plus MNIST's download
#   the first time.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   54 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# This is the shortest path through Fenwicks: handwritten digits in numpy arrays, a small
# convolutional net, Adam with an exponentially decaying learning rate, then training and
# an exact evaluation. The same notebook runs on a TPU, a GPU or the CPU: Fenwicks picks
# the accelerator, the engine (TensorFlow, or JAX where that reaches the TPU; tutorial 3),
# the distribution, the precision and where files go.
#
# Run it top to bottom. `SMOKE = True` in the next cell turns it into a run of seconds,
# which is how the test suite checks that every cell still works.

# %% [markdown]
# ## Parameters
#
# Every knob lives in this one cell, so you can change an experiment without hunting
# through the notebook (tools like papermill override this cell too). `BATCH_SIZE` is the
# *global* batch: on an 8-core TPU every core gets `BATCH_SIZE / 8` examples.

# %% tags=["parameters"]
SMOKE = False          # True: a tiny run that finishes in seconds (the test suite sets it)
BATCH_SIZE = 512       # global batch size, split evenly over the replicas
EPOCHS = 6
LEARNING_RATE = 2e-3   # Adam's initial learning rate
MIN_LEARNING_RATE = 1e-5  # the schedule decays towards this floor
WEIGHT_DECAY = 1e-4    # decoupled weight decay (AdamW), not applied to biases or BatchNorm
SEED = 42
PROJECT = 'mnist'

# %% [markdown]
# A smoke run keeps the same code path and shrinks only sizes: a few hundred examples, one
# epoch, a narrow net.

# %%
N_TRAIN, N_TEST, WIDTH = None, None, 32   # None: the whole split
if SMOKE:
    N_TRAIN, N_TEST, BATCH_SIZE, EPOCHS, WIDTH = 256, 128, 64, 1, 8

# %%
import numpy as np

import fenwicks as fw

fw.info()

# %% [markdown]
# `fw.info()` shows what Fenwicks found: the kind of accelerator, how many replicas train
# in sync, the compute precision (bfloat16 on a TPU, float16 on recent GPUs, float32 on a
# CPU) and the storage root. On a TPU reached over the network that root must be a
# `gs://` bucket, because such a TPU cannot read your Colab VM's disk.
#
# `get_project_dirs` gives a data directory and a work directory (checkpoints, TensorBoard
# logs, exports) under that root. We clean the work directory: the estimator *resumes*
# from whatever checkpoint it finds there, which is what you want after an interruption,
# but not when you start a new experiment.

# %%
data_dir, work_dir = fw.io.get_project_dirs(None, PROJECT)
fw.io.create_clean_dir(work_dir)
print('data:', data_dir)
print('work:', work_dir)

# %% [markdown]
# ## Data
#
# MNIST comes from tensorflow-datasets. It is small enough (47 MB as uint8) to keep in
# memory as numpy arrays, which is the simplest input there is. We read each split as one
# big batch instead of example by example: one `tf.data` element instead of 60,000.
#
# `fw.data.tfds_load` is `tfds.load` with one difference: when MNIST is not on disk yet
# and there is no network, it fails within seconds with an error saying so (tfds alone
# retries for minutes), and how to point `data_dir=` (or `TFDS_DATA_DIR`) at a prepared
# copy, e.g. a folder you uploaded or `gs://my-bucket/tensorflow_datasets`.

# %%
def load_split(split, limit=None):
    ds = fw.data.tfds_load('mnist', split=split, as_supervised=True)
    if limit:
        ds = ds.take(limit)
    images, labels = next(ds.batch(100_000).as_numpy_iterator())
    return images, labels.astype(np.int32)


X_train, y_train = load_split('train', N_TRAIN)
X_test, y_test = load_split('test', N_TEST)
print(X_train.shape, X_train.dtype, y_train.shape)

# %% [markdown]
# Before training anything, look at the data: are the classes balanced, and do the
# images and labels agree? Most input bugs (wrong labels, swapped axes, all-black images)
# are visible right here.

# %%
fw.plt.plot_counts_pie(y_train)

# %%
fw.plt.show_batch((X_train, y_train), n=16)

# %% [markdown]
# Pixels go from uint8 in [0, 255] to float32 in [0, 1]; the net's BatchNorm layers take
# care of the rest of the scaling.

# %%
X_train = (X_train / 255.0).astype(np.float32)
X_test = (X_test / 255.0).astype(np.float32)

# %% [markdown]
# An *input function* takes `params` and returns a `tf.data.Dataset`, exactly as with
# TPUEstimator. `params['batch_size']` is the per-replica batch size: the estimator divides
# the global batch size by the number of replicas and each replica reads its own share.

# %%
train_input_func = lambda params: fw.data.numpy_ds(
    X_train, y_train, batch_size=params['batch_size'], training=True, seed=SEED)
eval_input_func = lambda params: fw.data.numpy_ds(
    X_test, y_test, batch_size=params['batch_size'], training=False)

# %% [markdown]
# ## The network
#
# Three convolutional stages, each a 3x3 convolution + BatchNorm + ReLU; the last two end
# in 2x2 max pooling (28 -> 14 -> 7). Global max and average pooling then make the head
# independent of the image size, so the same net also fits the 8x8 digits of
# `python -m fenwicks demo`. `PYTORCH_PARAMS` gives PyTorch's initialisation and BatchNorm
# settings, which suit short training runs.
#
# `fw.models.mnist_net(c=WIDTH)` builds exactly this network; here it is spelled out to
# show the blocks. `build_nn` takes no arguments: the estimator calls it inside the
# distribution strategy's scope, so every variable is created on every replica.

# %%
def build_nn():
    c = WIDTH
    model = fw.Sequential()
    model.add(fw.layers.ConvBN(c, kernel_size=3, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(c * 2, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(c * 4, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.GlobalPools2D())
    model.add(fw.layers.Classifier(10, kernel_initializer=fw.layers.init_pytorch))
    return model

# %% [markdown]
# ## Optimiser and learning rate
#
# Adam with a learning rate that decays exponentially from `LEARNING_RATE` towards
# `MIN_LEARNING_RATE` over the whole run: large steps while the loss is far from its
# minimum, small ones at the end to settle. Weight decay is *decoupled* (AdamW): it
# shrinks the weights directly instead of going through Adam's adaptive scaling, and it
# skips biases and BatchNorm parameters, which it would only hurt.
#
# A schedule is just a function `step -> learning rate`; plot it before training.

# %%
steps_per_epoch = len(X_train) // BATCH_SIZE
total_steps = steps_per_epoch * EPOCHS
# A factor of e every quarter of the run: down to ~2% of LEARNING_RATE at the end.
lr_func = fw.train.exp_decay_lr(init_lr=LEARNING_RATE, decay_steps=max(1, total_steps // 4),
                                base_lr=MIN_LEARNING_RATE)
fw.plt.plot_lr_func(lr_func, total_steps)

# %%
opt_func = fw.train.adam_optimizer(lr_func, wd=WEIGHT_DECAY, exclude_from_wd='bn_and_bias')
model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='mean')

# %% [markdown]
# ## Train
#
# The estimator builds the model inside the distribution strategy, compiles the training
# loop (a whole epoch of steps per call, so a TPU is not starved by Python) and writes
# checkpoints and TensorBoard logs to `work_dir`. `train_and_evaluate` alternates one
# epoch of training with an evaluation on the test set and returns the history: the loss
# of every step and the metrics of every evaluation.
#
# `val_bs` can be any size: evaluation pads the last partial batch to a static shape and
# masks the padding out, so every test example counts exactly once.

# %%
est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir,
                                 trn_bs=BATCH_SIZE, val_bs=1000, seed=SEED)
history = est.train_and_evaluate(train_input_func, eval_input_func, epochs=EPOCHS)

# %%
fw.plt.plot_history(history)

# %% [markdown]
# ## Can the input keep up?
#
# An accelerator is only as fast as the data reaching it. `check_input` reads the
# training input alone, exactly as training reads it (same batch size and replicas, on
# this host), and compares its examples/s with what the last training run consumed. A
# prefetching input runs beside the training step, so when it is the slower of the two,
# training runs at its speed: below 1.1x the verdict is *input-bound*, and the line names
# the fixes that apply to this pipeline (cache after decoding, parallel reads and maps,
# prefetch, the tf.data service). `fw.data.numpy_ds` gathers each batch with one op, far
# faster than this net trains.
#
# For a closer look, `est.train(..., profile_steps=(a, b))` records global steps a to b
# with the engine's profiler (TensorFlow's, or JAX's on the JAX engine) into
# `work_dir/train`: TensorBoard's Profile tab (with `pip install
# tensorboard-plugin-profile`) then shows the trace, and on TensorFlow the input-pipeline
# analyzer.

# %%
print(est.check_input(train_input_func))

# %% [markdown]
# ## Evaluate
#
# `evaluate` on its own gives the final numbers. With the full data and 6 epochs expect
# well above 99% test accuracy (the same net reaches 99.6% on the 8x8 digits of the demo);
# a smoke run trains on a few hundred (in the test suite, random) images, so expect
# anything there.

# %%
result = est.evaluate(eval_input_func)
print(f"test accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f}, "
      f"after {result['global_step']} steps")

# %% [markdown]
# The checkpoints in `work_dir` make the run resumable: a new estimator on the same
# directory restores the weights, the optimiser state and the step, and `train` carries
# on. Predictions are class probabilities, one row per example:

# %%
probs = est.predict(lambda params: fw.data.numpy_ds(
    X_test[:16], None, batch_size=params['batch_size'], training=False))
predicted = np.argmax(np.asarray(probs), axis=-1)
print('predicted:', predicted)
print('true:     ', y_test[:16])

# %% [markdown]
# The same network trains on scikit-learn's 8x8 digits in `python -m fenwicks demo`.
#
# Next: [Tutorial 2](02_cifar10_resnet9.ipynb) trains a ResNet-9 on CIFAR-10 from
# TFRecords with data augmentation and the one-cycle schedule.
