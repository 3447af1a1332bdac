-- The state every trial starts from (seed `baseline`, kind sql_dump): applied with psql after db is
-- healthy and before the services that depend on it start. One transaction: all of it or nothing.
BEGIN;

UPDATE orders SET status = 'shipped' WHERE id = 1;

COMMIT;
