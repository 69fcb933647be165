"""Exactly once per epoch: what each process writes, in which order, and what a restart does.

The promise: the multiset of records trainers get in an epoch equals the source's (this host's
share of it), across SIGKILLs of any process, or the daemon fails with the reason — never
``done`` with records missing. Every hand-off is a rename; every step that a crash could cut
in two is either redone from a durable note or swept as ours (``layout.is_own_file``). The
files are in ``layout``'s tree; the modules here:

=====================  ==========================================================================
``download_log``       the downloader's download log ``progress/e<k>.log``: ``P <hash>`` per
                       object published, ``S <hash>`` per object skipped in epoch k
``journal``            writer i's commit journal ``journal/w<i>.log``: one line per shard commit
``ledger``             the shard ledger ``shards/``: shards published, shards trainers finished
``markers``            ``epochs/<k>.downloaded`` and ``epochs/<k>.complete``
``recovery``           what the supervisor does at start-up about files that vanished
``trained_objects``    which objects of an epoch a host's trainers finished (a position's
                       ``objects``); the job's tag a position carries
``host_positions``     every old host's positions read back for ``sharding.resume_from``
=====================  ==========================================================================

**The downloader publishes an object** (``cache_dir``):

1. ``meta/<obj>.json`` written (key, size, etag, epoch),
2. ``P <hash>`` appended to the download log of its epoch,
3. ``.tmp/<obj>.part`` renamed to ``ready/<obj>`` (the commit point: a writer may take it).

An object given up (404, 412, corrupt on every fetch) gets an ``S <hash>`` line instead. Once
every object of epoch k is logged, it writes ``epochs/<k>.downloaded``.

**A writer takes an object** by renaming ``ready/<obj>`` to ``claimed/w<i>-<obj>``; from then
on only writer i reads it. **It publishes a shard** (``Publisher.publish``, ``write/publish.py``):

1. ``.tmp/<shard>.part`` flushed and truncated to its records (complete, not yet visible),
   and ``shards/<shard>.mix`` written (which objects it holds; for positions, not the commit),
2. ``<shard> <records>`` appended to the ledger ``shards/e<k>.w<i>.log`` and fsynced,
3. one line appended to ``journal/w<i>.log`` and fsynced — **the commit point**: the shard
   name, its counter, the records taken so far from every object still open, and the objects
   whose last record is in this shard or an earlier one (``finished``),
4. the shard renamed into ``ram_dir/ready/`` (trainers may take it),
5. the ``finished`` objects' meta and claimed file deleted: each emptied, then renamed to a
   spare in ``cache_dir/.tmp`` (``spares.py``), which the downloader renames (never over an
   existing file) into its next ``.part`` or meta instead of creating one. To every step above
   and below a spare is a deleted file: it holds no bytes and no name of an object; a writer
   that stops deletes the spares in ``.tmp``, the supervisor does once every child has
   stopped, and start-up sweeps those a crash left with every other unlogged file in ``.tmp``.

A ledger line without its journal line names a shard that was never committed: a shard counts
as published only if the writer's last journal entry covers it (``ledger.published_shards``).

**The supervisor** writes ``epochs/<k>.complete`` (fsynced) once epoch k is downloaded and no
object of it is left in ``cache_dir`` ``ready/``, ``claimed/`` or ``meta/`` — every record is
then in a published shard — and deletes that epoch's download log. It appends each shard a
trainer finished (moved to ``done/`` or deleted from ``claimed/``) to ``shards/e<k>.delivered``,
fsynced, before it deletes the file in ``done/``; once no shard of a complete epoch is left on
the RAM disk it drops that epoch's ledger.

**Trainers** claim a shard by renaming ``ready/<shard>`` to ``claimed/<claimant>-<shard>`` while
holding ``consumers/<claimant>.lock``; a claim whose lock no live process holds goes back to
``ready/``. That is at least once for a trainer that restarts without a saved position, and
exactly once relative to a saved one (``consume/stream_position.py``).

**After a SIGKILL of a writer**, the supervisor restarts it; writer i reads the last entry of
its journal, renames that shard into ``ready/`` if it is still in ``.tmp`` (roll forward),
deletes the entry's ``finished`` objects, deletes its other temp shards (never committed), and
reopens each object in ``claimed/w<i>-*`` skipping the journalled number of records. The next
shard takes the next counter, so a redone shard may reuse the name of the one cut short (the
last ledger line of a name wins).

**After a SIGKILL of the downloader**, the supervisor restarts it; a ``.part`` whose hash is in
its epoch's download log is renamed into ``ready/`` (roll forward), any other ``.part`` is
deleted; a meta without its object and without a log line is deleted (written for a fetch that
never finished); a logged object whose file vanished before a writer took it is fetched again;
logged objects are not fetched again. The first epoch without ``downloaded`` is where it goes on.

**After a SIGKILL of the whole daemon** (its children die with it), ``prefetchd run`` with the
same config resumes the job (``state_dir/job.json``): ``recovery.recover`` runs before any child
starts (nothing vanished: nothing to do; shards finished meanwhile are noted delivered), then
every child recovers as above, the claims of dead trainers go back to ``ready/`` and the shards
in ``done/`` are noted delivered and deleted. With another config, a finished job or no
``job.json``, a new job starts and what the old one left is wiped. Trainers claim nothing
from the start of ``prefetchd run`` until that is decided: the job fence in ``ram_dir`` is
taken down first and written again only then (``fence.py``), so a trainer started before the
daemon never reads another job's shards.

**After a reboot emptying the RAM disk** (or ``cache_dir``), the owner marker's token no longer
matches ``disks.json``. Published shards that are neither delivered nor on the disk are lost, and
so are raw objects a writer had started (journalled positions) that left ``claimed/`` — and if
``cache_dir`` was emptied, every object of an epoch with a download log. Let k be the first
epoch with a loss: if trainers read nothing of epoch k or later, ``recovery.reset_epochs``
deletes those epochs' files, download logs, ledgers and markers and their objects in the
journals, and they are downloaded and written again (the seeded order brings the same records).
Otherwise the daemon fails, on every restart, saying why. The one window of at least once: a
shard finished in the last tick (0.2 s) before the daemon was killed, or while it was down,
counts as unread if the RAM disk is lost before the restart.
"""
