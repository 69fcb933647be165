"""Benchmark prefetchd against what users do today, on a real object store, in one run.

    python -m bench --quick            # < 3 minutes, everyday use
    python -m bench --network both     # the numbers in docs/benchmarks.md
    python -m bench --sweep            # the curves in docs/tuning.md

(from the repository root, in a venv with ``.[bench]``; ``scripts/bench.sh`` sets one up.)
Starts SeaweedFS (or moto, ``--store moto``) on 127.0.0.1, uploads seeded datasets (large:
64 MiB TFRecord objects; medium: 1-8 MiB TFRecord objects; small: 100-200 KiB raw objects),
then reads each one with every loader, interleaved, ``--repeats`` times:

    ceiling        s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)
    ceiling-crt    awscrt.s3.S3Client doing the same (ratios use the faster ceiling)
    baseline       boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)
    s3fs           s3fs.cat_file inside tf.py_function, the same pipeline
    prefetchd      the daemon (download.client: classic) read through prefetchd.tf.dataset
    prefetchd-crt  the same with download.client: crt
    floor          the same records pre-staged on tmpfs, read by TFRecordDataset

As root it runs inside a private network namespace (``bench.network``); ``--network shaped``
caps each connection from the store at ``--rate-mbit`` (a real store's per-connection limit),
``loopback`` does not, ``both`` runs both phases. Without root only ``loopback`` is possible,
on the machine's own loopback. Results: a table with ratios on stdout, ``results.json`` and
``plot.png`` under ``--out``.

One module per concern:

- ``cli``: the command line, the network phases, the whole run;
- ``datasets``: the datasets (a table: add a row for a new one), upload and the floor's copy;
- ``contenders``: the loaders (a table: add a row for a new one), ``ceilings`` (the copy
  tools' command lines) and ``readers`` (the trainer-side tf.data pipelines);
- ``runner``: one measured run of a contender, and the interleaved plan;
- ``trainer``: the trainer process (``python -m bench.trainer``); ``crt_ceiling``: the awscrt
  copy tool (``python -m bench.crt_ceiling``); ``sampler``: memory, RAM disk and CPU;
- ``store``: SeaweedFS or moto (launchers in ``testkit``); ``network``: namespace and shaping;
- ``environment``: packages, the processes' environment, the machine; ``results``/``report``:
  outputs and their (pure) arithmetic; ``sweep``: the tuning curves;
- ``manifest_scale`` and ``shuffle_quality``: benchmarks of their own
  (``python -m bench.manifest_scale``, ``python -m bench.shuffle_quality``).
"""
