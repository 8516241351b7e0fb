"""The worker: its runtime (the only long-lived nurseries), the job queue it calls, how it is
wired from settings, and the NOTIFY listener that wakes it."""
