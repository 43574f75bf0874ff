"""The binary COPY dumpers of slurmtel.store.copy against psycopg's own, and through PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import Engine, text

from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.store.copy import copy_rows, text_array
from slurmtel.store.jobs import write_attempts
from tests.conftest import fixture_path
from tests.factories import attempt

LAB = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")
ARRAYS = [[], ["gpu01"], ["gpu01", "gpu02"], ["nœud-é", None, ""], [None], ["a,b", '"q"', "{x}", "NULL"]]


@pytest.mark.parametrize("values", ARRAYS)
def test_text_arrays_are_the_bytes_psycopg_sends(database_url: str, values: list[str | None]) -> None:
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        transformer = Transformer(conn)
        transformer.set_dumper_types([conn.adapters.types["text"].array_oid], pq.Format.BINARY)
        (expected,) = transformer.dump_sequence([values], [PyFormat.BINARY])
    assert text_array(values) == bytes(expected)  # type: ignore[arg-type]
    assert text_array(tuple(values)) == bytes(expected)  # type: ignore[arg-type]


def test_text_arrays_refuse_nested_or_non_text_values() -> None:
    with pytest.raises(psycopg.DataError, match="flat sequences of str"):
        text_array([["gpu01"]])  # type: ignore[list-item]
    with pytest.raises(psycopg.DataError, match="got int"):
        text_array([1])  # type: ignore[list-item]


def test_tuples_lists_and_tres_maps_come_back_from_postgresql(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE copy_check (nodes text[], tres jsonb) ON COMMIT DROP"))
        copy_rows(
            conn,
            "copy_check",
            [("nodes", "text[]"), ("tres", "jsonb")],
            [
                (("gpu01", "gpu02"), {"gres/gpu": 2, "cpu": 16}),
                (["nœud-é", None], {}),
                ((), {"mem": 262144}),
            ],
        )
        rows = conn.execute(text("SELECT nodes, tres, tres::text FROM copy_check")).all()
    assert [tuple(r) for r in rows] == [
        (["gpu01", "gpu02"], {"gres/gpu": 2, "cpu": 16}, '{"cpu": 16, "gres/gpu": 2}'),
        (["nœud-é", None], {}, "{}"),
        ([], {"mem": 262144}, '{"mem": 262144}'),
    ]


def test_the_lab_attempts_are_stored_as_parsed(engine: Engine) -> None:
    attempts = [r for r in parse_sacct_json(LAB.read_bytes()) if isinstance(r, JobAttempt)]
    with engine.begin() as conn:
        assert write_attempts(conn, attempts).inserted == 22
    with engine.connect() as conn:
        stored = {
            (r.job_id_raw, r.submit_at): (r.nodes, r.alloc_tres, r.req_tres, r.nodelist)
            for r in conn.execute(
                text("SELECT job_id_raw, submit_at, nodes, alloc_tres, req_tres, nodelist FROM job_attempt")
            )
        }
    assert stored == {
        (a.job_id_raw, a.submit_at): (list(a.nodes), a.alloc_tres, a.req_tres, a.nodelist) for a in attempts
    }
    # the multi-node job of the lab, as sacct -a -D.txt shows it
    assert sorted(v[0] for v in stored.values() if len(v[0]) > 1) == [["gpu01", "gpu02"]]


def test_an_int_beyond_int4_is_refused_by_name_not_stored_as_its_low_bits(engine: Engine) -> None:
    # psycopg's own binary int4 dumper would write 2**40 as 0; the attempt is refused, named by
    # its field and value, and the other attempt of the batch is stored
    with engine.begin() as conn:
        stats = write_attempts(
            conn, [attempt(job_id_raw=1, array_job_id=1, array_task_id=2**40), attempt(job_id_raw=2)]
        )
    assert (stats.inserted, len(stats.refused)) == (1, 1)
    ((refused, reason),) = stats.refused
    assert refused.job_id_raw == 1
    assert reason == f"array_task_id is {2**40}, beyond int4 (-2147483648 .. 2147483647)"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT job_id_raw FROM job_attempt")).scalars().all() == [2]


def test_repeated_copies_on_one_connection_do_not_stack_json_dumpers(engine: Engine) -> None:
    """A pooled connection writes thousands of times: each COPY used to derive one more JSON
    dumper class from the last, and every later COPY got slower (0.4 s each after 2,000)."""
    from psycopg.types.json import Jsonb

    with engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE copy_again (v int4) ON COMMIT DROP"))
        raw = conn.connection.driver_connection
        assert raw is not None
        copy_rows(conn, "copy_again", [("v", "int4")], [(1,)])
        depth = len(raw.adapters.get_dumper(Jsonb, PyFormat.BINARY).__mro__)
        for n in range(50):
            copy_rows(conn, "copy_again", [("v", "int4")], [(n,)])
        assert len(raw.adapters.get_dumper(Jsonb, PyFormat.BINARY).__mro__) == depth
        assert conn.execute(text("SELECT CAST(:v AS jsonb)"), {"v": '{"b": 1, "a": 2}'}).scalar_one() == {
            "a": 2,
            "b": 1,
        }
