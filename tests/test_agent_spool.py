"""The agent's durable spool: kill -9 of a writer, bounded size, acks, a corrupt file."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from slurmtel.agent.spool import Spool

WRITER = textwrap.dedent(
    """
    import json, sys
    from slurmtel.agent.spool import Spool
    spool = Spool(sys.argv[1], max_bytes=1 << 40)
    n = 0
    while True:
        batch = []
        for _ in range(1 + n % 4):
            batch.append(("summary", json.dumps({"n": n, "pad": "x" * 200})))
            n += 1
        seqs = spool.append(batch)
        print(seqs[-1], n - 1, flush=True)
    """
)


def check_consistent(path: Path) -> tuple[list[int], list[int]]:
    """Rows' seqs and payload counters; asserts the stored counters match the rows."""
    db = sqlite3.connect(path)
    rows = db.execute("SELECT seq, bytes, payload FROM items ORDER BY seq").fetchall()
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    db.close()
    assert meta["item_count"] == len(rows)
    assert meta["payload_bytes"] == sum(r[1] for r in rows)
    return [r[0] for r in rows], [json.loads(r[2])["n"] for r in rows]


def test_kill_9_while_writing_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    Spool(path).close()  # create it before the writer and the acker race
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert child.stdout is not None
    head = Spool(path)
    acked = 0
    committed = []
    for line_number in range(1, 400):
        seq, n = map(int, child.stdout.readline().split())
        committed.append((seq, n))
        if line_number == 150:
            # the head reads a page and acks it while the agent keeps writing
            assert head.read_page(0, seq, ["summary"])[1] == seq
            acked = head.ack(seq)
            assert acked == seq
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    head.close()

    reopened = Spool(path)
    seqs, counters = check_consistent(path)
    last_reported_seq, last_reported_n = committed[-1]
    # nothing acked reappears; everything after it is there, without holes
    assert seqs[0] == acked + 1
    assert seqs == list(range(acked + 1, seqs[-1] + 1))
    # every batch the writer saw committed survived (more may have committed before the kill)
    assert seqs[-1] >= last_reported_seq
    # payload counters run in the same order, without holes: no half batch
    assert counters == list(range(counters[0], counters[-1] + 1))
    assert counters[-1] >= last_reported_n
    stats = reopened.stats()
    assert (stats.items, stats.last_seq, stats.acked_cursor) == (len(seqs), seqs[-1], acked)
    # sequence numbers are never reused, even after everything was acked
    reopened.read_page(acked, 10**6, ["summary"])
    assert reopened.ack(stats.last_seq) == stats.last_seq
    (new,) = reopened.append([("event", "{}")])
    assert new == stats.last_seq + 1
    reopened.close()


def test_bounded_size_evicts_oldest_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    spool = Spool(path, max_bytes=1000)
    payload = json.dumps({"pad": "y" * 89})  # 100 bytes
    assert len(payload) == 100
    for _ in range(25):
        spool.append([("summary", payload)])
    stats = spool.stats()
    assert (stats.items, stats.bytes, stats.evicted_total, stats.last_seq) == (10, 1000, 15, 25)
    assert [item.seq for item in spool.read(0, 100)] == list(range(16, 26))
    # one batch bigger than the room left evicts in the same transaction
    spool.append([("summary", payload)] * 3)
    assert spool.stats().evicted_total == 18
    spool.close()
    reopened = Spool(path, max_bytes=1000)
    assert reopened.stats().evicted_total == 18
    assert [item.seq for item in reopened.read(0, 100)] == list(range(19, 29))
    reopened.close()


def test_ack_is_idempotent_and_clamped(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite")
    seqs = spool.append([("summary", '{"a":1}'), ("event", '{"b":2}'), ("inventory", '{"c":3}')])
    assert seqs == [1, 2, 3]
    assert [(i.seq, i.kind, i.payload) for i in spool.read(0, 10)] == [
        (1, "summary", '{"a":1}'),
        (2, "event", '{"b":2}'),
        (3, "inventory", '{"c":3}'),
    ]
    # the same `after` gives the same items until they are acked
    assert spool.read(1, 1) == spool.read(1, 1)
    # a look serves nothing: nothing can be acked before a page went out
    assert spool.ack(2) == 0 and spool.stats().items == 3
    assert spool.read_page(0, 2, ["summary", "event", "inventory"])[1] == 2
    assert spool.ack(3) == 2  # the last item was not served: clamped
    assert spool.read_page(0, 10, ["summary"])[1] == 3  # other kinds are covered, not wanted
    assert spool.ack(2) == 2
    assert spool.ack(2) == 2
    assert spool.ack(1) == 1  # an older ack changes nothing
    assert [i.seq for i in spool.read(0, 10)] == [3]
    assert spool.ack(1000) == 3  # beyond what was served: clamped
    assert spool.read(0, 10) == []
    stats = spool.stats()
    assert (stats.items, stats.bytes, stats.acked_cursor, stats.last_seq) == (0, 0, 3, 3)
    assert spool.append([("summary", "{}")]) == [4]
    spool.close()


def test_state_is_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite")
    assert spool.get_state("summarizer") is None
    spool.set_state("summarizer", {"gpus": {"GPU-1": {"last_t": 1.5}}})
    spool.close()
    spool = Spool(tmp_path / "spool.sqlite")
    assert spool.get_state("summarizer") == {"gpus": {"GPU-1": {"last_t": 1.5}}}
    spool.delete_state("summarizer")
    assert spool.get_state("summarizer") is None
    spool.close()


def test_unreadable_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    path.write_bytes(b"this is not a database, just 64 bytes of noise ................")
    spool = Spool(path)
    assert spool.stats().items == 0
    assert spool.append([("summary", "{}")]) == [1]
    spool.close()
    aside = [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1


def test_spool_id_is_kept_and_new_for_a_new_file(tmp_path: Path) -> None:
    first = Spool(tmp_path / "a.sqlite")
    spool_id = first.stats().spool_id
    first.close()
    assert Spool(tmp_path / "a.sqlite").stats().spool_id == spool_id
    assert Spool(tmp_path / "b.sqlite").stats().spool_id != spool_id
    assert len(spool_id) == 32
