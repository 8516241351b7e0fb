"""PostgreSQL: the pool (the one thread facade), the embedded server, the job lifecycle, the
model registry and the migrations."""
