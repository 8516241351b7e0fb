"""The worker: ``runtime`` (the only long-lived nurseries) and ``job`` (one claimed job, to its
outcome), the job ``queue`` they call, ``wiring`` (a worker built from settings), ``listen``
(the NOTIFY listener that wakes it), and its ``counters`` and ``metrics``."""
