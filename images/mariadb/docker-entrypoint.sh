#!/usr/bin/env bash
# Entry point of forgelib/mariadb: the official mariadb/mysql images' contract on Debian's MariaDB 10.11.
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

# mariadb_env NAME: MARIADB_NAME, else MYSQL_NAME (either may come from its _FILE form), as MARIADB_NAME.
mariadb_env() {
  file_env "MARIADB_$1"
  file_env "MYSQL_$1"
  local m="MARIADB_$1" y="MYSQL_$1"
  export "$m"="${!m:-${!y:-}}"
}

# `docker run forgelib/mariadb:10.11 --max-connections=50` means the server with those options
if [ "${1:0:1}" = '-' ]; then
  set -- mariadbd "$@"
fi

case "$1" in mariadbd|mysqld) server=1 ;; *) server= ;; esac

if [ -n "$server" ] && [ "$(id -u)" = '0' ]; then
  # Running as root: make the data dir (a volume, maybe a bind mount) ours, then drop to mysql.
  mkdir -p /var/lib/mysql /run/mysqld
  find /var/lib/mysql /run/mysqld \! -user mysql -exec chown mysql:mysql '{}' + || :
  exec setpriv --reuid=mysql --regid=mysql --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ -n "$server" ] && [ ! -d /var/lib/mysql/mysql ]; then
  for v in ROOT_PASSWORD ROOT_HOST DATABASE USER PASSWORD RANDOM_ROOT_PASSWORD; do mariadb_env "$v"; done
  : "${MARIADB_ALLOW_EMPTY_ROOT_PASSWORD:=${MARIADB_ALLOW_EMPTY_PASSWORD:-${MYSQL_ALLOW_EMPTY_PASSWORD:-}}}"
  : "${MARIADB_ROOT_HOST:=%}"
  if [ -z "$MARIADB_ROOT_PASSWORD" ] && [ -z "$MARIADB_ALLOW_EMPTY_ROOT_PASSWORD" ] \
      && [ -z "$MARIADB_RANDOM_ROOT_PASSWORD" ]; then
    cat >&2 <<-'MSG'
	Error: Database is uninitialized and password option is not specified
	       You need to specify one of MARIADB_ROOT_PASSWORD, MARIADB_ROOT_PASSWORD_HASH,
	       MARIADB_ALLOW_EMPTY_ROOT_PASSWORD and MARIADB_RANDOM_ROOT_PASSWORD
	       (or their MYSQL_ forms), as the official image requires.
	MSG
    exit 1
  fi
  if [ -n "$MARIADB_RANDOM_ROOT_PASSWORD" ]; then
    MARIADB_ROOT_PASSWORD="$(head -c 18 /dev/urandom | base64)"
    echo "GENERATED ROOT PASSWORD: $MARIADB_ROOT_PASSWORD"
  fi

  mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db \
    --auth-root-authentication-method=normal --skip-name-resolve --rpm >/dev/null

  # A temporary server on its socket only, so nobody connects over TCP before initialisation is done.
  sock=/run/mysqld/forge-init.sock
  "$@" --skip-networking --socket="$sock" --skip-log-error >/dev/null 2>&1 &
  pid=$!
  client=(mariadb --protocol=socket --socket="$sock" -uroot --skip-auto-rehash)
  for _ in $(seq 300); do
    "${client[@]}" -e 'select 1' >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo >&2 "error: the server stopped during initialisation"; exit 1; }
    sleep 0.1
  done

  sql_escape() { sed -e "s/\\\\/\\\\\\\\/g" -e "s/'/\\\\'/g" <<<"$1"; }
  rootpw="$(sql_escape "$MARIADB_ROOT_PASSWORD")"
  {
    echo "SET @@SESSION.SQL_LOG_BIN=0;"
    echo "DELETE FROM mysql.global_priv WHERE user = '' OR (user = 'root' AND host NOT IN ('localhost'));"
    echo "ALTER USER 'root'@'localhost' IDENTIFIED BY '$rootpw';"
    if [ "$MARIADB_ROOT_HOST" != 'localhost' ]; then
      echo "CREATE USER 'root'@'$MARIADB_ROOT_HOST' IDENTIFIED BY '$rootpw';"
      echo "GRANT ALL ON *.* TO 'root'@'$MARIADB_ROOT_HOST' WITH GRANT OPTION;"
      echo "GRANT PROXY ON ''@'%' TO 'root'@'$MARIADB_ROOT_HOST' WITH GRANT OPTION;"
    fi
    echo "DROP DATABASE IF EXISTS test;"
    if [ -n "$MARIADB_DATABASE" ]; then
      echo "CREATE DATABASE IF NOT EXISTS \`$MARIADB_DATABASE\`;"
    fi
    if [ -n "$MARIADB_USER" ] && [ -n "$MARIADB_PASSWORD" ]; then
      echo "CREATE USER '$MARIADB_USER'@'%' IDENTIFIED BY '$(sql_escape "$MARIADB_PASSWORD")';"
      if [ -n "$MARIADB_DATABASE" ]; then
        echo "GRANT ALL ON \`$(sed 's/_/\\_/g' <<<"$MARIADB_DATABASE")\`.* TO '$MARIADB_USER'@'%';"
      fi
    fi
    echo "FLUSH PRIVILEGES;"
  } | "${client[@]}"

  client+=("-p$MARIADB_ROOT_PASSWORD")
  [ -n "$MARIADB_ROOT_PASSWORD" ] || unset 'client[${#client[@]}-1]'
  [ -z "$MARIADB_DATABASE" ] || client+=("$MARIADB_DATABASE")
  echo "forgelib/mariadb: running /docker-entrypoint-initdb.d"
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh)
        # executable: run it; otherwise source it, so it can use this script's variables (official behaviour)
        # shellcheck source=/dev/null
        if [ -x "$f" ]; then echo "  running $f"; "$f"; else echo "  sourcing $f"; . "$f"; fi ;;
      *.sql) echo "  running $f"; "${client[@]}" < "$f" ;;
      *.sql.gz) echo "  running $f"; gunzip -c "$f" | "${client[@]}" ;;
      *.sql.xz) echo "  running $f"; xzcat "$f" | "${client[@]}" ;;
      *.sql.zst) echo "  running $f"; zstd -dc "$f" | "${client[@]}" ;;
      */\*) ;;  # empty directory: the glob did not expand
      *) echo "  ignoring $f" ;;
    esac
  done

  kill "$pid"
  wait "$pid" || :
  echo "forgelib/mariadb: init process complete; ready for start up."
fi

exec "$@"
