"""The record kernel: TFRecord framing and tf.train.Example encoding, in C and its Python twin."""
