"""Where PostgreSQL's WAL and statements go per queue job: ``bench.queue``'s ``trioindex 1x8``
scenario (no-op jobs through the real worker) with ``pg_walinspect`` between the LSNs around
the run, and ``pg_stat_statements`` counting nested statements with their planning
(``track = all``, ``track_planning = on``) and ``track_functions = all``.

Prints, per job: WAL bytes and records by relation (each record counted under the relation
of its first block) and by record type, with their full-page images; updates and HOT updates
per table; plans, planning and execution time per statement (the statements inside the SQL
functions included); calls and time per function. The times are wall time inside the server,
so they swell with the machine's load: read the proportions and the counts. Run
``.venv/bin/python -m bench.queue_wal`` (``--jobs N``, default 2,000).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from bench.common import BenchPostgres, DbCounters, format_machine, machine_info
from bench.queue import Scenario, run_trioindex

_WAL_BY_RELATION = """
WITH r AS (SELECT start_lsn, record_length, fpi_length, resource_manager
           FROM pg_get_wal_records_info(%(a)s::pg_lsn, %(b)s::pg_lsn)),
     first_block AS (SELECT DISTINCT ON (start_lsn) start_lsn, relfilenode
                     FROM pg_get_wal_block_info(%(a)s::pg_lsn, %(b)s::pg_lsn)
                     ORDER BY start_lsn, block_id)
SELECT coalesce(c.relname, f.relfilenode::text, '(no block)') AS relation,
       r.resource_manager, count(*) AS records, sum(r.record_length) AS bytes,
       sum(r.fpi_length) AS fpi_bytes
FROM r LEFT JOIN first_block f USING (start_lsn)
LEFT JOIN pg_class c ON c.relfilenode = f.relfilenode
GROUP BY 1, 2 ORDER BY 4 DESC
"""
_WAL_BY_RECORD = """
SELECT resource_manager || ' ' || record_type, count(*), sum(record_length), sum(fpi_length)
FROM pg_get_wal_records_info(%(a)s::pg_lsn, %(b)s::pg_lsn) GROUP BY 1 ORDER BY 3 DESC
"""
_TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE n_tup_ins + n_tup_upd > 0 ORDER BY relname
"""
_STATEMENTS = """
SELECT calls, plans, total_plan_time, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%%pg_get_wal%%' AND query NOT LIKE '%%pg_stat%%'
ORDER BY total_plan_time + total_exec_time DESC LIMIT 20
"""
_FUNCTIONS = """
SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions
WHERE funcname NOT LIKE 'pg_get_wal%%' ORDER BY total_time DESC
"""


class _ProfiledPostgres(BenchPostgres):
    """The benchmark's server with every statement and function counted, each fresh database
    with ``pg_walinspect``; after the scenario's database is used, its profile is read."""

    def start_counting(self) -> None:
        for sql in (
            "ALTER SYSTEM SET track_functions = 'all'",
            "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
            "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
            "SELECT pg_reload_conf()",
        ):
            self._admin(sql)
        self.lsns: list[str] = []
        self.profile: dict[str, list[tuple[Any, ...]]] = {}

    def counters(self, url: str, *, settle_seconds: float = 10.0) -> DbCounters:
        counted = super().counters(url, settle_seconds=settle_seconds)
        self.lsns.append(counted.wal_lsn)
        return counted

    def fresh_database(self, prefix: str) -> contextlib.AbstractContextManager[str]:
        return self._profiled(prefix)

    @contextlib.contextmanager
    def _profiled(self, prefix: str) -> Iterator[str]:
        with super().fresh_database(prefix) as url:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_walinspect")
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            yield url
            span = {"a": self.lsns[-2], "b": self.lsns[-1]}
            with psycopg.connect(url, autocommit=True) as conn:
                for name, sql in (
                    ("relations", _WAL_BY_RELATION),
                    ("records", _WAL_BY_RECORD),
                    ("tables", _TABLES),
                    ("statements", _STATEMENTS),
                    ("functions", _FUNCTIONS),
                ):
                    self.profile[name] = conn.execute(sql, span).fetchall()


def _print_profile(profile: dict[str, list[tuple[Any, ...]]], jobs: int) -> None:
    def per(value: Any) -> float:
        return float(value or 0) / jobs

    print("\nWAL by relation (record's first block), per job: records, bytes (full-page images)")
    for rel, manager, records, size, fpi in profile["relations"][:20]:
        print(f"  {rel:56s} {manager:11s} {per(records):5.2f} {per(size):7.1f} ({per(fpi):5.1f})")
    print("\nWAL by record type, per job: records, bytes (full-page images)")
    for kind, records, size, fpi in profile["records"][:15]:
        print(f"  {kind:40s} {per(records):5.2f} {per(size):7.1f} ({per(fpi):5.1f})")
    print("\nrows per job: inserted, updated (HOT)")
    for table, inserted, updated, hot in profile["tables"]:
        print(f"  {table:30s} {per(inserted):5.2f} {per(updated):5.2f} ({per(hot):4.2f})")
    print("\nstatements (nested included) per job: calls, plans, plan ms, exec ms")
    for calls, plans, plan_ms, exec_ms, query in profile["statements"]:
        print(
            f"  {per(calls):6.3f} {per(plans):6.3f} {per(plan_ms):6.3f} {per(exec_ms):6.3f}  {query}"
        )
    print("\nfunctions per job: calls, total ms, self ms")
    for name, calls, total, own in profile["functions"]:
        print(f"  {name:34s} {per(calls):6.3f} {per(total):6.3f} {per(own):6.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.queue_wal", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs (2,000)")
    args = parser.parse_args(argv)
    print(format_machine(machine_info()))
    with _ProfiledPostgres() as pg:
        pg.start_counting()
        result = run_trioindex(pg, Scenario("trioindex", 1, 8), args.jobs)
        print(
            f"\ntrioindex 1x8, {args.jobs} jobs: {result.jobs_per_s:,.0f} jobs/s; per job: WAL"
            f" {result.wal_bytes_per_job:,.0f} B, {result.xact_per_job:.2f} transactions, CPU ms"
            f" client {result.client_cpu_ms_per_job:.3f} / PostgreSQL"
            f" {result.server_cpu_ms_per_job:.3f}; 1-minute load {result.load_average_1m:.1f}"
        )
        _print_profile(pg.profile, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
