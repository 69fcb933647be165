"""The record kernel: TFRecord framing and ``tf.train.Example`` encoding and decoding, used by
the writers (formats, shuffle, mixing) and the downloader (its check of TFRecord objects).

- ``framing``: the TFRecord frame and TensorFlow's masked CRC32C; reading and writing frames.
- ``example_encode`` / ``example_decode``: an Example written / read without protobuf.
- ``protocol.RecordKernel``: the per-batch operations (lines, tar samples, records, Examples,
  file checks, reordering, seeded draws), one call per batch of records.
- ``_native.c``: those operations in C; ``twin``: the same in pure Python, byte for byte (the
  reference, and the fallback without a compiler); ``choice.KERNEL``: the one that runs.

``prefetchd.tfrecord`` and ``prefetchd.example`` are the public faces of ``framing`` and the
two Example modules. Nothing is imported here: loading the C module waits for ``choice``.
"""
