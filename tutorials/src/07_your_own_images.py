# %% [markdown]
# # Tutorial 7: your own images
#
# **Run time**
#
# - Default size, on a 2-core CPU: up to about 25 minutes (the first of the 12 epochs
#   decodes the JPEGs; later ones read the cache), plus the flower photos' download
#   (218 MiB) the first time.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   38 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# Most real projects start with a folder of pictures sorted by hand into one sub-folder
# per class (the layout Kaggle and most labelling tools produce):
#
# ```
# images/
#   daisy/    100080576_f52e8ee070_n.jpg ...
#   roses/    10090824183_d02c613f10_m.jpg ...
# ```
#
# This tutorial turns such a folder into TFRecords, trains a classifier on it, exports the
# trained model as a SavedModel, reloads it the way a server would, and predicts.

# %% [markdown]
# ## Parameters
#
# Point `IMAGE_DIR` at your folder (in Colab, mount Google Drive or upload a zip). Left at
# `None`, the notebook uses TensorFlow's public flower photos (3,670 images, 5 classes).

# %% tags=["parameters"]
SMOKE = False          # True: generated images and a tiny run (the test suite sets it)
IMAGE_DIR = None       # your folder of class sub-folders; None: the flower photos
IMAGE_SIZE = 96        # images are resized to IMAGE_SIZE x IMAGE_SIZE
BATCH_SIZE = 128       # global batch size
EPOCHS = 12
LEARNING_RATE = 0.4    # peak learning rate per BATCH_SIZE examples (loss summed)
WEIGHT_DECAY = 5e-4    # per example
VALID_FRACTION = 0.15  # of each class, held out for validation
WIDTH = 32
SEED = 42
FLOWERS_URL = ('https://storage.googleapis.com/download.tensorflow.org/example_images/'
               'flower_photos.tgz')

# %%
if SMOKE:
    IMAGE_SIZE, BATCH_SIZE, EPOCHS, WIDTH = 32, 16, 1, 8

# %%
import os

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw

data_dir, work_dir = fw.io.get_project_dirs(None, 'own_images')
fw.io.create_clean_dir(work_dir)

# %% [markdown]
# ## The folder
#
# A smoke run draws its own little dataset, 24 PNGs per class of circles, squares and
# stripes in random colours, into a folder of the same layout. Whatever the source, the
# rest of the notebook only sees a folder of class sub-folders.

# %%
def draw(kind, rng, size=40):
    yy, xx = np.mgrid[:size, :size]
    cy, cx, r = rng.integers(12, size - 12, 2).tolist() + [rng.integers(6, 11)]
    if kind == 'circles':
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
    elif kind == 'squares':
        mask = (abs(yy - cy) < r) & (abs(xx - cx) < r)
    else:
        mask = (xx + rng.integers(0, 6)) % 8 < 4
    image = np.full((size, size, 3), rng.integers(0, 80, 3), np.uint8)
    image[mask] = rng.integers(150, 256, 3)
    return image


def generated_folder(root, per_class=24, seed=0):
    rng = np.random.default_rng(seed)
    for kind in ('circles', 'squares', 'stripes'):
        os.makedirs(os.path.join(root, kind), exist_ok=True)
        for i in range(per_class):
            png = tf.io.encode_png(draw(kind, rng))
            tf.io.write_file(os.path.join(root, kind, f'{i:03d}.png'), png)
    return root


if SMOKE:
    IMAGE_DIR = generated_folder('shapes')  # a local folder, like one you upload
elif IMAGE_DIR is None:
    archive = keras.utils.get_file('flower_photos.tgz', FLOWERS_URL, extract=True)
    IMAGE_DIR = next(os.path.join(d, 'flower_photos') for d in (archive, os.path.dirname(archive))
                     if os.path.isdir(os.path.join(d, 'flower_photos')))
print(IMAGE_DIR, sorted(os.listdir(IMAGE_DIR)))

# %% [markdown]
# ## Folder to TFRecords
#
# `data_dir_tfrecord` numbers the classes by their sorted folder names, holds out
# `VALID_FRACTION` of *each* class for validation (a stratified split, so a rare class is
# not left out), shuffles, and writes the encoded image bytes as they are: re-encoding
# would cost quality and time. It returns the class names; index = class id.

# %%
train_fn = os.path.join(data_dir, 'train.tfrec')
valid_fn = os.path.join(data_dir, 'valid.tfrec')
classes = fw.data.data_dir_tfrecord(IMAGE_DIR, train_fn, valid_fraction=VALID_FRACTION,
                                    valid_fn=valid_fn, num_shards=2, overwrite=True,
                                    seed=SEED)
n_train = fw.data.count_records(train_fn + '*')
n_valid = fw.data.count_records(valid_fn + '*')
print(classes, n_train, 'training and', n_valid, 'validation images')

# %% [markdown]
# The parser decodes each image (JPEG, PNG, GIF or BMP) and resizes it. Training images
# are flipped and shifted a little; both splits are scaled to [0, 1] as floats, on whole
# batches at once.

# %%
parser = lambda record: fw.data.tfexample_image_parser(record, IMAGE_SIZE, IMAGE_SIZE, 3)
to_float = lambda x: tf.cast(x, tf.float32) / 255.0
augment = lambda x: fw.transform.random_flip(
    fw.transform.random_pad_crop(to_float(x), IMAGE_SIZE // 8, mode='REFLECT'))
train_input_func = lambda params: fw.data.tfrecord_ds(
    train_fn + '*', parser, params['batch_size'], training=True, batch_transform=augment,
    cache=True, seed=SEED, input_context=params.get('input_context'))
valid_input_func = lambda params: fw.data.tfrecord_ds(
    valid_fn + '*', parser, params['batch_size'], training=False, batch_transform=to_float,
    input_context=params.get('input_context'))

# %%
labels = np.concatenate([y for _, y in valid_input_func({'batch_size': 256})])
fw.plt.plot_counts_pie(labels, class_names=classes, title='Validation images per class')

# %%
fw.plt.show_batch(train_input_func, n=16, class_names=classes)

# %% [markdown]
# ## Train
#
# The ResNet of tutorial 2, one stage deeper for the larger images. Decoding JPEGs is the
# slow part of this pipeline, so the decoded images are cached in memory (`cache=True`)
# after the first epoch.

# %%
def build_nn():
    c = WIDTH
    model = fw.Sequential()
    model.add(fw.layers.ConvBN(c, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvResBlk(c * 2, res_convs=2, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(c * 4, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvResBlk(c * 8, res_convs=2, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(c * 8, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.GlobalPools2D())
    model.add(fw.layers.Classifier(len(classes), weight=0.125))
    return model


steps_per_epoch = max(1, n_train // BATCH_SIZE)
total_steps = steps_per_epoch * EPOCHS
lr_func = fw.train.one_cycle_lr(LEARNING_RATE / BATCH_SIZE, total_steps,
                                max(1, total_steps // 5), fw.train.linear_decay())
opt_func = fw.train.sgd_optimizer(lr_func, mom=0.9, wd=WEIGHT_DECAY * BATCH_SIZE)
model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='sum')
est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, os.path.join(work_dir, 'model'),
                                 trn_bs=BATCH_SIZE, val_bs=BATCH_SIZE, seed=SEED)
history = est.train_and_evaluate(train_input_func, valid_input_func, epochs=EPOCHS)
fw.plt.plot_history(history)

# %% [markdown]
# ## Export, reload, predict
#
# `export_saved_model` writes a SavedModel with a `serving_default` signature that takes a
# batch of images, prepared exactly like the validation batches (float32 in [0, 1]), and
# returns class probabilities. Each export is a new version folder, `export/<version>`, as
# TensorFlow Serving expects; the call returns its path, and `fw.train.latest_export`
# finds the newest later. TensorFlow Serving, TFLite converters and plain
# `tf.saved_model.load` all read it; nothing of Fenwicks is needed to use it.

# %%
export_dir = est.export_saved_model(os.path.join(work_dir, 'export'))
served = tf.saved_model.load(export_dir)

images, true_labels = next(iter(valid_input_func({'batch_size': 8})))
probs = served.serve(images)['predictions'].numpy()
for p, y in zip(probs, true_labels.numpy(), strict=True):
    print(f'predicted {classes[p.argmax()]:>10} ({p.max():.0%}), true {classes[y]}')

# %% [markdown]
# The reloaded model must agree with the estimator that trained it: same weights, same
# computation.

# %%
est_probs = est.predict(lambda params: valid_input_func(params).take(1))
print('max difference:', np.abs(est_probs[:len(probs)] - probs).max())

# %% [markdown]
# Next: [Tutorial 8](08_cpu_gpu_tpu.ipynb) measures how much faster the accelerators are.
