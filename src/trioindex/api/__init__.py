"""The Python API applications build on, importable from :mod:`trioindex` itself:

* :mod:`.index` — :class:`~trioindex.api.index.Index` (Trio): the shared resources, the lazily
  opened embedding model, search (answered by :mod:`trioindex.search.answers`), ingest, wait
  and delete;
* :mod:`.sync_index` — :class:`~trioindex.api.sync_index.SyncIndex` and ``connect``: the same
  methods, blocking, over one event loop in a background thread;
* :mod:`.reports` — what an ingest did (:class:`~trioindex.api.reports.IngestReport`).
"""
