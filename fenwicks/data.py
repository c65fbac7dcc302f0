"""Input pipelines: numpy, TFRecord, tfds into tf.data. (Being built: input issue.)"""
