"""prefetchd's development kit: what the tests, the benchmark (``bench``) and the demo share.

- ``testkit.s3server``: a moto S3 server on 127.0.0.1 (context manager and command line);
- ``testkit.seaweedfs``: a SeaweedFS S3 gateway on 127.0.0.1 (the benchmark's store);
- ``testkit.sample_data``: seeded synthetic datasets with record ids, uploaded to a bucket, and
  a TensorFlow-free reader of the records they hold;
- ``testkit.trainers``: trainer processes, delivered records and bytes on disk, for the tests
  that run the daemon;
- ``testkit.demo_train``: the demo's small Keras training loop (``scripts/demo.sh``).

Run its command lines from the repository root (``python -m testkit.s3server ...``). Not part
of the prefetchd wheel.
"""
