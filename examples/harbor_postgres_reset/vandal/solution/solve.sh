#!/bin/bash
# Record what this trial's stack looks like first, then corrupt the database and the workspace.
set -euo pipefail
mkdir -p /logs/agent
q() { psql -X -tA -c "$1"; }
{
  echo "widget1=$(q 'SELECT name FROM widgets WHERE id = 1')"
  echo "rows=$(q 'SELECT count(*) FROM widgets')"
  echo "tables=$(q "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = 'public'")"
  echo "workspace=$(ls -A /work | tr '\n' ' ')"
  echo "todo=$(cat /work/TODO 2>/dev/null || echo '(missing)')"
  echo "logs=$(stat -c '%n:%a:%U' /logs /logs/* | tr '\n' ' ')"
} > /logs/agent/first_seen.txt
cat /logs/agent/first_seen.txt
q "UPDATE widgets SET name = 'vandalised'; INSERT INTO widgets SELECT g, 'junk' FROM generate_series(2, 500) g; CREATE TABLE graffiti (x int)" >/dev/null
rm -f /work/TODO
head -c 4096 /dev/urandom > /work/junk.bin
echo "vandalised: $(q 'SELECT count(*) FROM widgets') rows, workspace: $(ls -A /work | tr '\n' ' ')"
