"""Benchmark prefetchd against what users do today, on a real object store, in one run.

    python -m bench --quick            # < 5 minutes, every dataset small: the bars, often
    python -m bench                    # the numbers in docs/benchmarks.md
    python -m bench --sweep            # the curves in docs/tuning.md

(from the repository root, in a venv with ``.[bench]``; ``scripts/bench.sh`` sets one up.)
Starts SeaweedFS (or moto, ``--store moto``) on 127.0.0.1, uploads seeded datasets (large:
64 MiB TFRecord objects; medium: 1-8 MiB TFRecord objects; small: 64-200 KiB raw objects;
tfrecord16: 16 MiB TFRecord objects of 64 KiB records; lines: 1-4 MiB JSONL objects of
~120-byte lines; tar: 2-8 MiB WebDataset tars), then reads each one with every loader that
reads its format, interleaved, ``--repeats`` times:

    ceiling        s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)
    ceiling-crt    awscrt.s3.S3Client doing the same (the CPU bars compare with this one)
    baseline       boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)
    s3fs           s3fs.cat_file inside tf.py_function, the same pipeline
    prefetchd      the daemon (download.client: classic) read through prefetchd.tf.dataset
    prefetchd-crt  the same with download.client: crt
    lean           the lean design limit: awscrt 16 objects at a time into tmpfs files, each
                   read by TFRecordDataset once complete (TFRecord datasets only)
    floor          the same records pre-staged on tmpfs, read by TFRecordDataset

Networks (``--network``): ``loopback`` (unshaped), ``paced`` (``bench.proxy`` in front of the
store: 75 MiB/s per connection, 30 ms before each response's first byte; large, medium and
small, read by the ceiling-crt, the baseline and prefetchd), ``shaped`` (``tc`` caps each
connection at ``--rate-mbit``; root only). The default, ``bars``, is loopback then paced: the
networks the issue's bars are judged on; ``both`` is loopback then shaped. As root everything
runs inside a private network namespace (``bench.network``); without root on the host's
loopback. Results: a table with ratios, the daemon's CPU per GB, object, record and file
beside the ceiling's and the lean limit's, and the bars table (``bench.bars``) on stdout, in
``results.md`` and ``results.json`` (and ``plot.png`` with matplotlib) under ``--out``. What
cannot run here (no s3fs, s5cmd, awscrt or matplotlib) is skipped with a message.

One module per concern:

- ``cli``: the command line, the network phases, the whole run;
- ``datasets``: the datasets (a table: add a row for a new one), upload and the floor's copy;
- ``contenders``: the loaders (a table: add a row for a new one), ``ceilings`` (the copy
  tools' command lines) and ``readers`` (the trainer-side tf.data pipelines);
- ``runner``: one measured run of a contender, and the interleaved plan;
- ``trainer``: the trainer process (``python -m bench.trainer``); ``crt_ceiling``: the awscrt
  copy tool (``python -m bench.crt_ceiling``); ``lean``: the lean limit's downloader
  (``python -m bench.lean``); ``sampler``: memory, RAM disk, CPU and the daemon's start-up;
- ``store``: SeaweedFS or moto (launchers in ``testkit``); ``network``: namespace and shaping;
  ``proxy``: the paced network's proxy (``python -m bench.proxy``);
- ``environment``: packages, the processes' environment, the machine; ``results``/``report``:
  outputs and their (pure) arithmetic; ``bars``: the issue's bars (pure); ``sweep``: the
  tuning curves;
- ``manifest_scale``, ``shuffle_quality`` and ``replay``: benchmarks of their own
  (``python -m bench.manifest_scale``, ``python -m bench.shuffle_quality``, ``python -m
  bench.replay``: ``epochs.order: replayable`` beside ``fast``).
- ``profile_writer``, ``profile_download``, ``profile_trainer``: one stage measured on its own
  (``python -m bench.profile_writer``, ...; "Profiling one stage" in ``docs/benchmarks.md``).
"""
