# trioindex tasks. Every recipe installs what it needs first (`setup` is idempotent and fast
# once done).

set shell := ["bash", "-euo", "pipefail", "-c"]
# pass recipe arguments through as "$@", so quoted arguments stay whole (`just cli search "a b"`)
set positional-arguments

export HF_HUB_OFFLINE := "1"
export TRANSFORMERS_OFFLINE := "1"

bin := ".venv/bin"
# where pip finds CPU-only builds of torch when none is on local disk or pip's configured indexes
torch_cpu_index := "https://download.pytorch.org/whl/cpu"

# Run a worker (embedded PostgreSQL + folder store + local model when nothing is configured).
worker *ARGS: setup setup-ocr
    {{bin}}/trioindex worker "$@"

# Run the whole test suite on one pytest-xdist worker per core, at most four (each worker starts
# its own embedded PostgreSQL and S3 server); `just test -n 0 ...` runs it in this process.
test *ARGS: setup setup-jdbc setup-ocr setup-browser
    {{bin}}/pytest -n "$(( $(nproc) < 4 ? $(nproc) : 4 ))" "$@"

# The PostgreSQL JDBC driver for the Java example's test (Debian's libpostgresql-jdbc-java),
# installed when running as root and missing; otherwise that one test skips and says why.
setup-jdbc:
    #!/usr/bin/env bash
    ls /usr/share/java/postgresql*.jar >/dev/null 2>&1 && exit 0
    [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null && command -v javac >/dev/null || exit 0
    echo "installing the PostgreSQL JDBC driver (libpostgresql-jdbc-java), once" >&2
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpostgresql-jdbc-java >/dev/null 2>&1; }
    install || { apt-get update -q >/dev/null 2>&1 && install; } \
        || echo "could not install libpostgresql-jdbc-java; the JDBC test will skip" >&2

# Not a dependency of `test` (the test runs for about a minute: `just test tests/test_pgbouncer.py`).
# PgBouncer (Debian's pgbouncer) for tests/test_pgbouncer.py and bench/fleet.py, installed when
# running as root and missing; otherwise that test skips and says why.
setup-pgbouncer:
    #!/usr/bin/env bash
    command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]] && exit 0
    [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || exit 0
    echo "installing PgBouncer (pgbouncer), once" >&2
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null 2>&1; }
    install || { apt-get update -q >/dev/null 2>&1 && install; } \
        || echo "could not install pgbouncer; the PgBouncer test will skip" >&2

# Headless Chromium and its WebDriver for the console's browser tests (Debian's chromium and
# chromium-driver), installed when running as root and missing; otherwise those tests skip and
# say why.
setup-browser:
    #!/usr/bin/env bash
    command -v chromium >/dev/null && command -v chromedriver >/dev/null && exit 0
    [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || exit 0
    echo "installing Chromium and its driver (chromium, chromium-driver), once" >&2
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }
    install || { apt-get update -q >/dev/null 2>&1 && install; } \
        || echo "could not install chromium and chromium-driver; the console's browser tests will skip" >&2

# The random-interleaving property test (tests/test_interleavings.py) with a longer budget than
# `test`'s fixed seed: the seed (new unless given) and the figures are printed; other arguments
# go to pytest (docs/test-results/interleavings.md).
# Interleavings on real PostgreSQL: `--steps N` per example (40), `--examples N` (100), `--seed N`.
fuzz *ARGS: setup
    #!/usr/bin/env bash
    set -euo pipefail
    export TRIOINDEX_FUZZ_STEPS=40 TRIOINDEX_FUZZ_EXAMPLES=100
    rest=()
    while (($#)); do
        case $1 in
            --steps) export TRIOINDEX_FUZZ_STEPS=$2; shift 2 ;;
            --examples) export TRIOINDEX_FUZZ_EXAMPLES=$2; shift 2 ;;
            --seed) export TRIOINDEX_FUZZ_SEED=$2; shift 2 ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    {{bin}}/pytest tests/test_interleavings.py -p no:cacheprovider "${rest[@]}"

# Lint and type-check.
lint: setup
    {{bin}}/ruff check src tests bench testkit deploy
    {{bin}}/ruff format --check src tests bench testkit deploy
    {{bin}}/mypy

# Any trioindex command, e.g. `just cli ingest docs/ --wait`. Like every recipe it runs in the
# repository root, from any sub-folder: paths are relative to the root (so are document keys).
cli *ARGS: setup
    @[[ "{{invocation_directory()}}" == "{{justfile_directory()}}" ]] \
        || echo "just cli: running in {{justfile_directory()}}; paths are relative to it" >&2
    @{{bin}}/trioindex "$@"

# Install the locked environment into .venv, plus the local embedding model (CPU-only torch, via
# pip: a +cpu wheel on local disk or pip's configured indexes, else the PyTorch CPU index). Done
# once: the stamp .venv/.setup-stamp holds a hash of uv.lock, pyproject.toml,
# requirements-local.txt and the venv's Python version, and while it matches `setup` does nothing
# (a few milliseconds). `rm .venv/.setup-stamp` forces a new install.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp=.venv/.setup-stamp
    key() {
        { echo "bytecode compiled"; cat uv.lock pyproject.toml requirements-local.txt
          {{bin}}/python -I -S -c 'import sys; print(sys.version)' 2>/dev/null || true
        } | sha256sum | cut -d' ' -f1
    }
    [[ -f $stamp && "$(<$stamp)" == "$(key)" ]] && exit 0
    echo "setting up .venv: the locked environment and CPU-only torch (about a minute, once)" >&2
    command -v uv >/dev/null || python3 -m pip install -q uv
    # bytecode compiled once here (as the Dockerfile does): PYTHONDONTWRITEBYTECODE, set in some
    # environments, would otherwise make every process compile every module it imports
    uv sync --frozen --inexact --python 3.11 -q --compile-bytecode
    pip=(python3.11 -m pip --python {{bin}}/python install -q -r requirements-local.txt)
    "${pip[@]}" 2>/dev/null || "${pip[@]}" --extra-index-url {{torch_cpu_index}}
    key > "$stamp"

# Tesseract OCR with Korean and English (Debian's packages), which reads scanned PDFs and images.
# Installed when missing and running as root with apt-get; otherwise it says so, OCR stays off
# (such files are refused, naming why) and the OCR tests are skipped with that reason.
setup-ocr:
    #!/usr/bin/env bash
    set -euo pipefail
    have() { command -v tesseract >/dev/null && tesseract --list-langs 2>/dev/null | grep -qx kor \
        && tesseract --list-langs 2>/dev/null | grep -qx eng; }
    have && exit 0
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "installing Tesseract OCR (Korean and English), once" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            tesseract-ocr tesseract-ocr-kor tesseract-ocr-eng >/dev/null; } \
            || echo "setup-ocr: could not install Tesseract; OCR is off and its tests skip" >&2
    else
        echo "setup-ocr: no Tesseract with Korean and English; as root:" \
            "apt-get install tesseract-ocr tesseract-ocr-kor tesseract-ocr-eng (OCR is off)" >&2
    fi

# Benchmarks (figures, not pass/fail): queue, embedding step, pipeline, memory, pgai peer. `--quick` for a smoke run.
bench *ARGS: setup
    {{bin}}/python -m bench.queue "$@"
    {{bin}}/python -m bench.embed "$@"
    {{bin}}/python -m bench.pipeline "$@"
    {{bin}}/python -m bench.memory "$@"
    {{bin}}/python -m bench.peer "$@"

bench-queue *ARGS: setup
    {{bin}}/python -m bench.queue "$@"

# OCR quality and speed: CER per language (Korean, English) and CPU per page on pages rendered
# from the Vim tutors and "scanned" (rotation, blur, noise), through trioindex's OCR path, with
# the variants of page segmentation and dpi (docs/test-results/formats.md, about 15 min on 2
# cores). Installs a Korean font (fonts-nanum) when root and missing.
bench-ocr *ARGS: setup setup-ocr
    #!/usr/bin/env bash
    set -euo pipefail
    if ! ls /usr/share/fonts/truetype/nanum/NanumGothic.ttf >/dev/null 2>&1 \
        && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "installing a Korean font (fonts-nanum), once" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-nanum >/dev/null \
            || echo "bench-ocr: could not install fonts-nanum" >&2
    fi
    {{bin}}/python -m bench.ocr "$@"

# PDF text engines: pypdf (today's) against PDFium on text-layer PDFs, CPU ms per page and text
# agreement (docs/test-results/formats.md). Give PDF files or folders.
bench-pdf *ARGS: setup
    {{bin}}/python -m bench.pdf "$@"

# 1, 4, 16 and 64 real workers on one embedded PostgreSQL (max_connections 100): claim throughput,
# connections per worker idle and busy, wait events, PostgreSQL CPU per job (docs/test-results/fleet.md).
bench-fleet *ARGS: setup
    {{bin}}/python -m bench.fleet "$@"

# What one new pooled connection costs, direct and through PgBouncer, with pgvector's types
# read on every connection or once a pool (docs/test-results/fleet.md).
bench-pool-connect *ARGS: setup
    {{bin}}/python -m bench.pool_connect "$@"

# Enqueue from SQL (trioindex_enqueue_documents) against the raw rows, one connection, in
# batches (docs/test-results/enqueue.md).
bench-enqueue *ARGS: setup
    {{bin}}/python -m bench.enqueue "$@"

# pgai installs into its own venv under ~/.cache on first use.
# `--profile`: where one trioindex run's CPU goes (statements, functions; py-spy stacks if installed).
# trioindex next to pgai's vectorizer worker (docs/test-results/peer.md); `--ingest 5000`: ingest alone.
bench-peer *ARGS: setup
    {{bin}}/python -m bench.peer "$@"

# PostgreSQL CPU per small document: trioindex's group functions next to the same rows written
# set-based, the document's data alone and pgai's one row (docs/test-results/sql_floor.md);
# `--parts`: also the data without its full-text column, or one of the vector's foreign keys.
bench-sql-floor *ARGS: setup
    {{bin}}/python -m bench.sql_floor "$@"

# The vector index at scale: float32, halfvec and bit HNSW (re-ranked) built, grown and queried
# side by side, and the store path next to a raw COPY (--n base vectors, 200,000 by default; the
# real set needs `python -m bench.index_corpus` first, which embeds for hours on two cores).
bench-index-scale *ARGS: setup
    {{bin}}/python -m bench.index_scale "$@"

# Where a ranking's time goes at scale (graph scan, re-rank from TOAST or from the row,
# ef_search, candidates per result), variants taking turns query by query; 200,000 1024-d
# vectors by default (about 12 minutes on the loaded 2-core machine).
bench-index-ranking *ARGS: setup
    {{bin}}/python -m bench.index_ranking "$@"

# The first vector-index build by phase (pg_stat_progress_create_index every 50 ms) in several
# build forms, and what a vector stored after a build starts costs; prints only (figures in
# docs/test-results/peer.md, "The first index build by phase").
bench-index-build *ARGS: setup
    {{bin}}/python -m bench.index_build "$@"

# Search quality: nDCG@10 and recall@10 per mode (vector, text, hybrid) on a labelled English +
# Korean set built from this machine's manual pages and Vim tutor, with the local model (about
# 10 min on 2 cores), beside a reference BM25 (bm25s, the `bench` dependency group, installed
# here). Writes its section of docs/test-results/search.md; `--quick` prints only.
eval *ARGS: setup
    uv sync --frozen --inexact --python 3.11 --group bench -q
    {{bin}}/python -m bench.search eval "$@"

# Search latency over 100k chunks (local model and a 1024-dimension server model; ef_search,
# iterative scan, recall@10 against exact search): docs/test-results/search.md.
bench-search *ARGS: setup
    {{bin}}/python -m bench.search speed "$@"

# Search over HTTP next to `Index.search` (100k chunks, 16 client processes) and upload over
# HTTP next to `ingest` (1,000 small files); `--baseline REF` also serves REF's src/:
# docs/test-results/http.md.
bench-http *ARGS: setup
    {{bin}}/python -m bench.http "$@"

# A model switch against first indexing (same documents, same server): docs/test-results/switch.md.
bench-switch *ARGS: setup
    {{bin}}/python -m bench.switch "$@"

# Fault-injection run: three workers, kill -9, outages; checks every invariant.
chaos *ARGS: setup
    {{bin}}/python -m bench.chaos "$@"

# Mutation pass over the fencing, locking, retry, hand-back, drain and shutdown code: each
# curated mutant applied to a copy of the package, its tests run against it (about 15 min on
# 2 cores; not part of `test`). Writes docs/test-results/mutation.md. `--list`, `--only NAME`.
mutants *ARGS: setup
    {{bin}}/python -m bench.mutants "$@"

# A private Docker engine (docker.io and Compose v2 from Debian trixie's docker-compose package,
# installed as root when missing; deploy/dockerd.py), stand-ins tagged under the real names only
# for images no registry serves, then the checks (migrate once, hostnames, ingest, health,
# `compose stop`, `kill -s KILL`, `restart db`, `--scale worker=6`, logs) and `down -v`; podman
# only where Docker cannot run. First runs tests/test_deploy_files.py with that Compose on PATH.
# Result: ~/.cache/trioindex-deploy/last-check.json; docs/test-results/deployment.md has times.
# `docker compose up` on the unmodified compose.yaml, checked for real (about 5 min from cache).
deploy-test *ARGS: setup
    #!/usr/bin/env bash
    set -euo pipefail
    if compose_bin=$({{bin}}/python -m deploy.dockerd install); then
        PATH="$compose_bin:$PATH" {{bin}}/pytest -q -p no:cacheprovider tests/test_deploy_files.py
    fi
    TRIOINDEX_CONTAINER_TESTS=1 {{bin}}/pytest -m containers tests/test_deploy_containers.py \
        -p no:cacheprovider "$@"

# `just down -v` also drops the data volumes.
# The stack on your own Docker engine with Compose v2: `docker compose up -d --build`.
up *ARGS:
    docker compose up -d --build "$@"

down *ARGS:
    docker compose down "$@"
