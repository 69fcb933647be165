"""Benchmark prefetchd against what users do today, on a real object store, in one run.

    python -m bench --quick            # < 5 minutes, every dataset small: the bars, often
    python -m bench                    # the numbers in docs/benchmarks.md
    python -m bench --datasets tfrecord16,small --loaders \\
        ceiling-crt,baseline,prefetchd-crt,prefetchd-native,lean,floor   # issue 28's table
    python -m bench --sweep            # the curves in docs/tuning.md

(from the repository root, in a venv with ``.[bench]``; ``scripts/bench.sh`` sets one up.)
Starts SeaweedFS (or moto, ``--store moto``) on 127.0.0.1, uploads seeded datasets (large:
64 MiB TFRecord objects; medium: 1-8 MiB TFRecord objects; small: 96-160 KiB raw objects;
tfrecord16: 16 MiB TFRecord objects of 64 KiB records; lines: 1-4 MiB JSONL objects of
~120-byte lines; tar: 2-8 MiB WebDataset tars), then reads each one with every loader that
reads its format, interleaved, ``--repeats`` times (5; ``--quick`` 1). The daemon runs in a
user's layout (``--layout user``: its cache on the local disk, writers and connections as
``prefetchd init`` sizes them; ``--layout bench``: the cache on tmpfs, 2 writers, 32
connections; ``bench.harness.layout``):

    ceiling        s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)
    ceiling-crt    awscrt.s3.S3Client doing the same (the CPU bars compare with this one)
    baseline       boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)
    s3fs           s3fs.cat_file inside tf.py_function, the same pipeline
    prefetchd      the daemon (download.client: classic) read through prefetchd.tf.dataset
    prefetchd-crt  the same with download.client: crt
    prefetchd-native  the same with download.client: native (the C GET client)
    lean           the lean design limit: awscrt 16 objects at a time into tmpfs files, each
                   read by TFRecordDataset once complete (TFRecord datasets only)
    floor          the same records pre-staged on tmpfs, read by TFRecordDataset

Networks (``--network``): ``loopback`` (unshaped), ``paced`` (``bench.drivers.paced_proxy`` in front
of the store: 75 MiB/s per connection, 30 ms before each response's first byte; large, medium,
small and tfrecord16, read by the ceiling-crt, the baseline and prefetchd), ``shaped`` (``tc``
caps each connection at ``--rate-mbit``; root only). The default, ``bars``, is loopback then
paced: the networks the issue's bars are judged on; ``both`` is loopback then shaped. As root
everything runs inside a private network namespace (``bench.harness.network``); without root on
the host's loopback. Results: a table with ratios, the daemon's CPU per GB, object, record and file
beside the ceiling's and the lean limit's, and the bars tables (``bench.harness.bars``: every
bar, then issue 28's table, each with the median and the worst run) on stdout, in
``results.md`` and ``results.json`` (and ``plot.png`` with matplotlib) under ``--out``. What
cannot run here (no s3fs, s5cmd, awscrt or matplotlib) is skipped with a message.

Four subpackages, by kind:

- ``harness/``, the benchmark itself: ``cli`` (the command line, the network phases, the whole
  run); ``datasets`` (a table: add a row for a new one; upload and the floor's copy);
  ``contenders`` (the loaders, a table: add a row for a new one) and ``ceilings`` (the copy
  tools' command lines); ``runner`` (one measured run of a contender, and the interleaved
  plan); ``layout`` (where the daemon's cache goes, its writers and connections: ``--layout``);
  ``sampler`` (memory, RAM disk, CPU and the daemon's start-up); ``store`` (SeaweedFS or
  moto, launchers in ``testkit``); ``network`` (namespace and shaping); ``environment``
  (packages, the processes' environment, the machine); ``results``/``report`` (outputs and
  their pure arithmetic); ``bars`` (the issues' bars, median and worst per repeat, pure).
- ``drivers/``, the processes the harness starts: ``trainer`` (``python -m
  bench.drivers.trainer``) with its tf.data pipelines (``readers``); ``crt``, the one awscrt
  driver, as the ceiling-crt copy tool (``python -m bench.drivers.crt ceiling``) and as the
  lean limit's downloader (``python -m bench.drivers.crt lean``); ``paced_proxy``, the paced
  network's proxy (``python -m bench.drivers.paced_proxy``).
- ``studies/``, benchmarks of their own: ``sweep`` and ``keep_sweep`` (``--sweep``,
  ``--keep-sweep``), ``manifest_scale``, ``shuffle_quality`` and ``replay`` (``python -m
  bench.studies.manifest_scale``, ``python -m bench.studies.shuffle_quality``, ``python -m
  bench.studies.replay``: ``epochs.order: replayable`` beside ``fast``).
- ``profile/``, one stage measured on its own: ``writer``, ``download``, ``trainer``,
  ``startup`` (``python -m bench.profile.writer``, ...; "Profiling one stage" in
  ``docs/benchmarks.md``).
"""
