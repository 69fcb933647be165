"""Every message one process writes for another: one codec shape, a version each.

Each message is a frozen dataclass with ``VERSION``, ``encode() -> bytes`` and
``decode(bytes)``, read by the rule for other versions in ``wire.py``:

- ``status_record.StatusRecord``: ``state_dir/status.json``, supervisor → status, metrics,
  trainers (with ``DaemonState``, its ``state``);
- ``child_report.ChildReport``: ``state_dir/children/<child>.json``, child → supervisor (its
  counters: ``counters.py``; its activity: ``activity.py``);
- ``consumer_report.ConsumerReport``: ``ram_dir/consumers/<claimant>.lock``, trainer → supervisor;
- ``epoch_keep.EpochKeep``: ``state_dir/epochs/<k>.keep.json``, downloader → supervisor.

(The writer journal, which refuses a newer version, is exactly-once's.)
"""
