-- postgres_baseline: the state every trial of this pack starts from.
-- Applied by forge's sql_dump recipe after app-db is healthy and before widgets-api starts:
--   docker compose exec -T app-db psql -v ON_ERROR_STOP=1 -U app -d app < assets/postgres_baseline.sql
-- One transaction, so a failure leaves the factory state untouched and psql exits non-zero.
BEGIN;

DELETE FROM widgets;
INSERT INTO widgets (id, name) VALUES (1, 'baseline');

COMMIT;
