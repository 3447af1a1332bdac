# Oracle for cache_order_status: streamed to `sh -s` in the runner service (PG* and REDIS_HOST are set
# there by shared/compose.yaml).
set -eu
status=$(psql -tA -c "SELECT status FROM orders WHERE id = 1")
redis-cli -h "$REDIS_HOST" SET order:1:status "$status"
echo "order 1 is $status; cached it as order:1:status" >&2
