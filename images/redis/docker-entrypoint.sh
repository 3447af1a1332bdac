#!/bin/sh
# Entry point of forgelib/redis, after the official image's docker-entrypoint.sh.
set -e

# `docker run forgelib/redis:7.0 --appendonly yes` or `... /etc/redis.conf` means redis-server with those
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
  set -- redis-server "$@"
fi

if [ "$1" = 'redis-server' ] && [ "$(id -u)" = '0' ]; then
  # Running as root: own the data dir (a volume, maybe a bind mount, maybe a dump.rdb copied in), drop to redis.
  find . \! -user redis -exec chown redis '{}' + || :
  exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi

if [ "$1" = 'redis-server' ]; then
  # The official image compiles Redis with protected mode off (ports are only reachable when published);
  # Debian's binary has it on. Turn it off unless the command line or its config file decides.
  shift
  conf=''
  if [ "$#" -gt 0 ] && [ "${1%.conf}" != "$1" ]; then
    conf="$1"
    shift
  fi
  case " $* " in
    *protected-mode*) ;;  # the command line decides
    *)
      if [ -z "$conf" ] || ! grep -Eq '^[[:space:]]*protected-mode' "$conf" 2>/dev/null; then
        set -- --protected-mode no "$@"
      fi ;;
  esac
  if [ -n "$conf" ]; then
    set -- redis-server "$conf" "$@"
  else
    set -- redis-server "$@"
  fi
  # the official image's umask for data files, when the environment left the default
  if [ "$(umask)" = '0022' ]; then
    umask 0077
  fi
fi

exec "$@"
