"""The pipeline steps a claimed job runs: parse + chunk, then embed (docs/design/architecture.md).

Each step is prepare (one fenced transaction) → external work outside any transaction →
commit (one fenced transaction that re-validates ownership and the prepared snapshot). Every
step replays idempotently: run again at any point, it converges on the same stored result.
"""
