"""What the tests and the benchmarks share, so that neither imports the other.

* ``postgres`` — a throwaway embedded PostgreSQL and its migrated template database;
* ``documents`` — real documents of every format (the corpus writers);
* ``embed_server`` — the fault-injecting fake embedding server (TEI + OpenAI), also standalone;
* ``processes`` — running ``trioindex`` and its dependencies as processes;
* ``claim_tokens`` — the trigger that records every claim token, for log scans;
* ``chaos`` — the chaos run and its invariant checks.

Importable from the repository root (pytest's ``pythonpath``, ``python -m bench.X``).
"""
