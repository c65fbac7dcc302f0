# %% [markdown]
# # Tutorial 6: time-series forecasting with a GRU
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 1 minute, plus the 13 MB download the first time.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   33 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# The Jena climate record: a weather station of the Max Planck Institute for
# Biogeochemistry measured 14 quantities every 10 minutes from 2009 to 2016. We forecast
# the next day's temperature, hour by hour, from the last three days of temperature,
# pressure and wind speed.
#
# New here compared with the image tutorials: windows cut from one long series, a split by
# *time* (not at random), a recurrent network, and a **regression** model function (mean
# squared error) instead of a classifier. Nothing in the estimator changes.

# %% [markdown]
# ## Parameters

# %% tags=["parameters"]
SMOKE = False          # True: synthetic weather and a tiny run (the test suite sets it)
BATCH_SIZE = 256       # global batch size
EPOCHS = 5
LEARNING_RATE = 3e-3   # Adam's initial learning rate, decayed exponentially
WEIGHT_DECAY = 1e-4    # decoupled (AdamW)
INPUT_HOURS = 72       # the model sees the last three days...
HORIZON_HOURS = 24     # ...and predicts each of the next 24 hours
GRU_UNITS = 64
SEED = 42
CSV_URL = ('https://storage.googleapis.com/tensorflow/tf-keras-datasets/'
           'jena_climate_2009_2016.csv.zip')

# %%
SYNTHETIC_DAYS = None
if SMOKE:
    BATCH_SIZE, EPOCHS, GRU_UNITS, SYNTHETIC_DAYS = 64, 1, 8, 60

# %%
import csv
import io
import zipfile

import keras
import numpy as np

import fenwicks as fw

_, work_dir = fw.io.get_project_dirs(None, 'weather')
fw.io.create_clean_dir(work_dir)

# %% [markdown]
# ## The data
#
# The real CSV is a 13 MB zip file from the Keras examples bucket. In a smoke run (or
# offline) we write a synthetic CSV with the same header instead: daily and yearly
# temperature cycles, a wandering pressure and gusty wind, plus noise. The rest of the
# notebook cannot tell the difference.

# %%
COLUMNS = ['Date Time', 'p (mbar)', 'T (degC)', 'Tpot (K)', 'Tdew (degC)', 'rh (%)',
           'VPmax (mbar)', 'VPact (mbar)', 'VPdef (mbar)', 'sh (g/kg)', 'H2OC (mmol/mol)',
           'rho (g/m**3)', 'wv (m/s)', 'max. wv (m/s)', 'wd (deg)']


def synthetic_csv(path, days, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(days * 144) / 144.0                        # time in days, every 10 min
    temp = 9 - 8 * np.cos(2 * np.pi * t / 365) - 4 * np.cos(2 * np.pi * t)
    temp += np.cumsum(rng.normal(0, 0.05, t.size))          # weather systems drift
    pressure = 990 + np.cumsum(rng.normal(0, 0.05, t.size))
    wind = rng.gamma(2.0, 1.0, t.size)
    wind[rng.random(t.size) < 0.001] = -9999.0               # the real file has these too
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for i in range(t.size):
            row = [''] * len(COLUMNS)
            row[0] = f'{1 + int(t[i]) % 28:02d}.01.2009 {int(t[i] * 24) % 24:02d}:00:00'
            row[1], row[2], row[12] = f'{pressure[i]:.2f}', f'{temp[i]:.2f}', f'{wind[i]:.2f}'
            writer.writerow([value or '0' for value in row])
    return path


def jena_csv():
    if SYNTHETIC_DAYS:
        # Local, like the downloaded file: the notebook itself reads it.
        return open(synthetic_csv('jena_synthetic.csv', SYNTHETIC_DAYS))
    zip_path = keras.utils.get_file('jena_climate_2009_2016.csv.zip', CSV_URL)
    archive = zipfile.ZipFile(zip_path)
    return io.TextIOWrapper(archive.open('jena_climate_2009_2016.csv'), encoding='utf-8')


with jena_csv() as f:
    reader = csv.reader(f)
    header = next(reader)
    wanted = [header.index(name) for name in ('T (degC)', 'p (mbar)', 'wv (m/s)')]
    raw = np.array([[float(row[i]) for i in wanted] for row in reader], dtype=np.float32)
print(f'{len(raw):,} rows of temperature, pressure, wind speed')

# %% [markdown]
# Two cleaning steps, each for a reason:
#
# * the wind sensor writes -9999 when it fails; a wind speed cannot be negative, so those
#   become 0 (otherwise one bad reading dominates the normalisation);
# * 10-minute readings are far more detailed than an hourly forecast needs: keeping one
#   row per hour cuts the work by six.

# %%
raw[:, 2] = np.maximum(raw[:, 2], 0.0)
hourly = raw[5::6]
hours = np.arange(len(hourly))
day_phase = 2 * np.pi * (hours % 24) / 24
# The time of day as a point on a circle: 23:00 is next to 00:00, not 23 units away.
series = np.column_stack([hourly, np.sin(day_phase), np.cos(day_phase)]).astype(np.float32)

# %% [markdown]
# ## Split by time, normalise with training statistics
#
# A random split would put hours from the same afternoon in training and test: the model
# would look better than it is. We train on the first 70% of the record, validate on the
# next 20% and test on the last 10%. Mean and standard deviation come from the training
# part only: the test period must stay unseen.

# %%
n = len(series)
train_end, valid_end = int(0.7 * n), int(0.9 * n)
mean = series[:train_end].mean(axis=0)
std = series[:train_end].std(axis=0) + 1e-6
normalised = (series - mean) / std


def windows(part):
    """Inputs: INPUT_HOURS rows of all features; targets: the next HORIZON_HOURS
    temperatures (column 0)."""
    count = len(part) - INPUT_HOURS - HORIZON_HOURS + 1
    idx = np.arange(count)[:, None]
    X = part[idx + np.arange(INPUT_HOURS)]
    y = part[idx + INPUT_HOURS + np.arange(HORIZON_HOURS), 0]
    return X.astype(np.float32), y.astype(np.float32)


X_train, y_train = windows(normalised[:train_end])
X_valid, y_valid = windows(normalised[train_end:valid_end])
X_test, y_test = windows(normalised[valid_end:])
print('train', X_train.shape, 'valid', X_valid.shape, 'test', X_test.shape)

# %% [markdown]
# ## A GRU forecaster
#
# A GRU reads the 72 hours in order and keeps a summary of what matters in its state; a
# dense layer maps the final state to the 24 hourly temperatures at once. Predicting the
# whole day in one shot avoids feeding the model its own (errorful) predictions.
# `fw.models.rnn_forecaster` builds this; its output layer runs in float32, so the loss
# is computed accurately under mixed precision.

# %%
build_nn = lambda: fw.models.rnn_forecaster((INPUT_HOURS, X_train.shape[-1]),
                                             horizon=HORIZON_HOURS, units=GRU_UNITS,
                                             cell='gru')


steps_per_epoch = len(X_train) // BATCH_SIZE
total_steps = steps_per_epoch * EPOCHS
lr_func = fw.train.exp_decay_lr(init_lr=LEARNING_RATE, decay_steps=max(1, total_steps // 4),
                                base_lr=LEARNING_RATE / 100)
opt_func = fw.train.adam_optimizer(lr_func, wd=WEIGHT_DECAY)
model_func = fw.train.get_reg_model_func(build_nn, opt_func)

# %% [markdown]
# `get_reg_model_func` is the regression counterpart of `get_clf_model_func`: mean squared
# error as the loss, mean absolute error (`mae`) and `mse` as metrics, and the raw outputs
# as predictions.

# %%
est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir,
                                 trn_bs=BATCH_SIZE, val_bs=BATCH_SIZE, seed=SEED)
history = est.train_and_evaluate(
    lambda params: fw.data.numpy_ds(X_train, y_train, params['batch_size'], training=True,
                                    seed=SEED, input_context=params.get('input_context')),
    lambda params: fw.data.numpy_ds(X_valid, y_valid, params['batch_size'], training=False,
                                    input_context=params.get('input_context')),
    epochs=EPOCHS)
fw.plt.plot_history(history)

# %% [markdown]
# ## How good is it?
#
# Errors in degrees Celsius, on the test period. The baseline to beat is *persistence*:
# "tomorrow at this hour will be as today at this hour", which is hard to beat on
# weather. A model that does not beat it has learned nothing useful.

# %%
preds = est.predict(lambda params: fw.data.numpy_ds(
    X_test, None, params['batch_size'], training=False))
to_celsius = lambda z: z * std[0] + mean[0]
pred_c, true_c = to_celsius(np.asarray(preds)), to_celsius(y_test)
persistence_c = to_celsius(X_test[:, -24:, 0])[:, :HORIZON_HOURS]
print(f'GRU MAE:         {np.abs(pred_c - true_c).mean():.2f} degC')
print(f'persistence MAE: {np.abs(persistence_c - true_c).mean():.2f} degC')

# %% [markdown]
# One test window: the three days the model saw, then the day it forecast against what
# happened.

# %%
i = len(X_test) // 2
fw.plt.plot_forecast(true_c[i], pred_c[i], history=to_celsius(X_test[i, :, 0]),
                     labels=['temperature (degC)'])

# %% [markdown]
# Next: [Tutorial 7](07_your_own_images.ipynb) trains on a folder of your own images.
