#!/usr/bin/env bash
# Entry point of forgelib/postgres: the official postgres image's contract on Debian's PostgreSQL 15.
set -Eeo pipefail

# file_env VAR [DEFAULT]: VAR or VAR_FILE (docker secrets), not both.
file_env() {
  local var="$1" fileVar="${1}_FILE" def="${2:-}"
  if [ "${!var:-}" ] && [ "${!fileVar:-}" ]; then
    echo >&2 "error: both $var and $fileVar are set (but are exclusive)"
    exit 1
  fi
  local val="$def"
  if [ "${!var:-}" ]; then
    val="${!var}"
  elif [ "${!fileVar:-}" ]; then
    val="$(< "${!fileVar}")"
  fi
  export "$var"="$val"
  unset "$fileVar"
}

# `docker run forgelib/postgres:15 -c fsync=off` means postgres with those options
if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi

if [ "$1" = 'postgres' ] && [ "$(id -u)" = '0' ]; then
  # Running as root: make the data dir (a volume, maybe a bind mount) ours, then drop to postgres.
  mkdir -p "$PGDATA"
  chmod 00700 "$PGDATA" || :
  find "$PGDATA" \! -user postgres -exec chown postgres '{}' + || :
  mkdir -p /var/run/postgresql
  chown postgres:postgres /var/run/postgresql || :
  chmod 3777 /var/run/postgresql || :
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ "$1" = 'postgres' ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  file_env POSTGRES_PASSWORD
  file_env POSTGRES_USER postgres
  file_env POSTGRES_DB "$POSTGRES_USER"
  file_env POSTGRES_INITDB_ARGS
  : "${POSTGRES_HOST_AUTH_METHOD:=}"

  if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != 'trust' ]; then
    cat >&2 <<-'MSG'
	Error: Database is uninitialized and superuser password is not specified.
	       You must specify POSTGRES_PASSWORD to a non-empty value for the
	       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".
	       Or set POSTGRES_HOST_AUTH_METHOD=trust to allow all connections without a password
	       (not recommended), as the official image does.
	MSG
    exit 1
  fi

  mkdir -p "$PGDATA"
  chmod 00700 "$PGDATA" || :
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is deliberately word-split, as in the official image
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
    --encoding=UTF8 --locale=C.UTF-8 $POSTGRES_INITDB_ARGS >/dev/null

  # Local (socket) connections are trusted; TCP needs the password (scram-sha-256), as in the official image.
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  printf '\nhost all all all %s\n' "$auth" >> "$PGDATA/pg_hba.conf"

  # A temporary server on the socket only, so nobody connects over TCP before initialisation is done.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p ${PGPORT:-5432}" -w start >/dev/null

  export PGPASSWORD="$POSTGRES_PASSWORD"
  psql_base=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
  if [ "$POSTGRES_DB" != 'postgres' ]; then
    "${psql_base[@]}" --dbname postgres --set db="$POSTGRES_DB" <<-'SQL' >/dev/null
	CREATE DATABASE :"db" ;
	SQL
  fi
  psql=("${psql_base[@]}" --dbname "$POSTGRES_DB")

  echo "forgelib/postgres: running /docker-entrypoint-initdb.d"
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh)
        # executable: run it; otherwise source it, so it can use this script's variables (official behaviour)
        # shellcheck source=/dev/null
        if [ -x "$f" ]; then echo "  running $f"; "$f"; else echo "  sourcing $f"; . "$f"; fi ;;
      *.sql) echo "  running $f"; "${psql[@]}" -f "$f" >/dev/null ;;
      *.sql.gz) echo "  running $f"; gunzip -c "$f" | "${psql[@]}" >/dev/null ;;
      *.sql.xz) echo "  running $f"; xzcat "$f" | "${psql[@]}" >/dev/null ;;
      *.sql.zst) echo "  running $f"; zstd -dc "$f" | "${psql[@]}" >/dev/null ;;
      */\*) ;;  # empty directory: the glob did not expand
      *) echo "  ignoring $f" ;;
    esac
  done
  unset PGPASSWORD

  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "forgelib/postgres: init process complete; ready for start up."
fi

exec "$@"
