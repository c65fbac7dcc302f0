"""TensorFlow's own gs:// client against a real GCS server, and `fw.gcs.setup()` branches."""

from __future__ import annotations

import numpy as np


def test_tensorflow_gs_client_round_trips(gcs_emulator):
    """TFRecord through tf.data, a CheckpointManager save/restore and a tf.summary event
    file, all on gs:// through TensorFlow's built-in client (one subprocess for speed)."""
    base = gcs_emulator.unique_url("tfclient")
    records = [f"record-{i}".encode() * (i + 1) for i in range(7)]
    weights = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    out = gcs_emulator.run_json(f"""
        import json, os
        import numpy as np
        import tensorflow as tf

        base = {base!r}
        tf.io.gfile.makedirs(base + "/work")
        with tf.io.TFRecordWriter(base + "/data.tfrec") as writer:
            for record in {records!r}:
                writer.write(record)
        read = [r.numpy().decode("latin1")
                for r in tf.data.TFRecordDataset(base + "/data.tfrec")]

        variable = tf.Variable(np.array({weights.tolist()!r}, np.float32))
        step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(w=variable, step=step)
        manager = tf.train.CheckpointManager(checkpoint, base + "/work/ckpt", max_to_keep=2)
        for i in range(3):
            step.assign(i + 1)
            manager.save(checkpoint_number=i + 1)
        variable.assign(tf.zeros_like(variable))
        step.assign(0)
        restored = tf.train.Checkpoint(w=variable, step=step).restore(manager.latest_checkpoint)
        restored.assert_consumed()

        writer = tf.summary.create_file_writer(base + "/work/logs")
        with writer.as_default():
            for i in range(4):
                tf.summary.scalar("loss", 1.0 / (i + 1), step=i)
        writer.close()
        events = tf.io.gfile.glob(base + "/work/logs/events.out.tfevents.*")
        scalars = []
        for raw in tf.data.TFRecordDataset(events):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                scalars.append([event.step, float(tf.make_ndarray(value.tensor))])
        print(json.dumps(dict(
            read=read, w=variable.numpy().tolist(), step=int(step.numpy()),
            latest=manager.latest_checkpoint, kept=manager.checkpoints,
            events=len(events), scalars=scalars)))
    """)
    assert out["read"] == [r.decode("latin1") for r in records]
    np.testing.assert_array_equal(np.array(out["w"], np.float32), weights)
    assert out["step"] == 3
    assert out["latest"] == base + "/work/ckpt/ckpt-3"
    assert out["kept"] == [base + "/work/ckpt/ckpt-2", base + "/work/ckpt/ckpt-3"]
    assert out["events"] == 1
    assert out["scalars"] == [[i, np.float32(1.0 / (i + 1))] for i in range(4)]
