#!/bin/sh
# The part of the postgres image's entrypoint compose.yaml relies on: on first start, a cluster
# whose superuser is POSTGRES_USER (password POSTGRES_PASSWORD, scram over TCP) with database
# POSTGRES_DB; then the server on every address.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "$(id -u)" = 0 ]; then
    install -d -o postgres -g postgres -m 700 "$PGDATA"
    exec runuser -u postgres -- "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
    # UTF8 like the postgres image (LANG=en_US.utf8 there): without a locale, initdb picks
    # SQL_ASCII, and psycopg then returns text columns as bytes.
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\";" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
