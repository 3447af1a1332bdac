#!/usr/bin/env bash
# The hand-written shell loop forge is measured against (benchmarks/overhead_bench.py): per trial, on the
# pack's own compose file, `docker compose up --wait` -> psql < seed -> the oracle -> the same state check
# -> `docker compose down --volumes`. No labels, no results on disk, no log capture: the least a careful
# user would write. The stack is always downed (EXIT/INT/TERM trap), also when a step fails.
#
# usage: shell_baseline.sh [-n TRIALS] [ORACLE_EXEC_ARGS...] -- CHECK_EXEC_ARGS...
#   ORACLE_EXEC_ARGS / CHECK_EXEC_ARGS: what follows `docker compose exec -T`, e.g.
#     -w /work runner python3 /pack/oracle.py -- runner cat /work/submission.txt
# environment:
#   BASELINE_COMPOSE_FILE   the compose file (required)
#   BASELINE_SEED_SERVICE   postgres service the seed goes into (required)
#   BASELINE_SEED_FILE      the sql_dump seed (required)
#   BASELINE_PGUSER         psql user (default postgres); BASELINE_PGDATABASE (default postgres)
#   BASELINE_ORACLE_STDIN   a file streamed to the oracle's stdin (an oracle `script:`), optional
#   BASELINE_EXPECT         what the check must print; BASELINE_MATCH equals|contains (default equals)
#   BASELINE_SPLIT_UP       1: forge's order (up the seeded service, seed, then up the rest) instead of
#                           up everything, then seed (default 0)
#   BASELINE_PROJECT        compose project name prefix (default benchsh-<pid>); trial i is <prefix>-<i>
#   FORGE_IMAGE_*           the image variables the compose file reads (set as forge sets them)
set -Eeuo pipefail
trap 'echo "shell_baseline.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

die() { printf 'shell_baseline: error: %s\n' "$*" >&2; exit 2; }

trials=1
if [[ ${1:-} == -n ]]; then
  trials=${2:?-n needs a number}
  shift 2
fi
oracle=()
while (($#)) && [[ $1 != -- ]]; do
  oracle+=("$1")
  shift
done
(($#)) || die "missing '--' before the check's exec arguments"
shift
check=("$@")
((${#check[@]})) || die "no check command after '--'"

compose_file=${BASELINE_COMPOSE_FILE:?BASELINE_COMPOSE_FILE is required}
seed_service=${BASELINE_SEED_SERVICE:?BASELINE_SEED_SERVICE is required}
seed_file=${BASELINE_SEED_FILE:?BASELINE_SEED_FILE is required}
pguser=${BASELINE_PGUSER:-postgres}
pgdb=${BASELINE_PGDATABASE:-postgres}
expect=${BASELINE_EXPECT:-}
match=${BASELINE_MATCH:-equals}
prefix=${BASELINE_PROJECT:-benchsh-$$}
[[ -f $compose_file ]] || die "no compose file $compose_file"
[[ -f $seed_file ]] || die "no seed file $seed_file"

project=""
t0=$EPOCHREALTIME
lap() { # print "time <step> <milliseconds since the last lap>" (bash 5 EPOCHREALTIME: no forks)
  local now=$EPOCHREALTIME
  printf 'time %s %d\n' "$1" "$(((10#${now/./} - 10#${t0/./}) / 1000))"
  t0=$now
}
dc() { docker compose -p "$project" -f "$compose_file" "$@"; }

down() {
  if [[ -n $project ]]; then
    timeout 120 docker compose -p "$project" -f "$compose_file" down --volumes --remove-orphans \
      >/dev/null 2>&1 || echo "shell_baseline: warning: could not down $project" >&2
    project=""
  fi
}
trap down EXIT
trap 'down; exit 130' INT TERM

for ((i = 1; i <= trials; i++)); do
  project="$prefix-$i"
  t0=$EPOCHREALTIME
  if [[ ${BASELINE_SPLIT_UP:-0} == 1 ]]; then
    # forge's order: the seeded service (and what it depends on) first, the seed, then everything else
    timeout 300 docker compose -p "$project" -f "$compose_file" up --detach --wait "$seed_service" >/dev/null 2>&1 \
      || { dc logs --tail 50 >&2 || true; die "compose up $seed_service failed for $project"; }
    lap up_seeded
  else
    timeout 300 docker compose -p "$project" -f "$compose_file" up --detach --wait >/dev/null 2>&1 \
      || { dc logs --tail 50 >&2 || true; die "compose up failed for $project"; }
    lap up
  fi
  timeout 300 docker compose -p "$project" -f "$compose_file" exec -T "$seed_service" \
    psql -v ON_ERROR_STOP=1 -q -U "$pguser" -d "$pgdb" <"$seed_file" >/dev/null
  lap seed
  if [[ ${BASELINE_SPLIT_UP:-0} == 1 ]]; then
    timeout 300 docker compose -p "$project" -f "$compose_file" up --detach --wait >/dev/null 2>&1 \
      || { dc logs --tail 50 >&2 || true; die "compose up failed for $project"; }
    lap up_rest
  fi
  if ((${#oracle[@]})); then
    if [[ -n ${BASELINE_ORACLE_STDIN:-} ]]; then
      timeout 300 docker compose -p "$project" -f "$compose_file" exec -T "${oracle[@]}" \
        <"$BASELINE_ORACLE_STDIN" >/dev/null
    else
      timeout 300 docker compose -p "$project" -f "$compose_file" exec -T "${oracle[@]}" </dev/null >/dev/null
    fi
    lap oracle
  fi
  observed=$(timeout 60 docker compose -p "$project" -f "$compose_file" exec -T "${check[@]}" </dev/null)
  observed=${observed%$'\n'}
  case $match in
    equals) [[ $observed == "$expect" ]] ;;
    contains) [[ $observed == *"$expect"* ]] ;;
    *) die "BASELINE_MATCH must be equals or contains, not $match" ;;
  esac || { echo "shell_baseline: trial $i: check saw '$observed', expected ($match) '$expect'" >&2; exit 1; }
  lap check
  down
  lap down
  echo "trial $i ok"
done
