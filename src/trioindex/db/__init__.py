"""PostgreSQL: the pool (the one thread facade), the embedded server, the job state machine
(jobs), the fence every write after a claim goes through, document version transitions
(versions), the audit trail (events), the model registry and the migrations."""
