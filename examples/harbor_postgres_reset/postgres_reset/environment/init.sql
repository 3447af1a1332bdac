-- Factory state: run once by the postgres entrypoint when the data directory is first initialised
-- (mounted into /docker-entrypoint-initdb.d). Every trial starts from here *before* its seed is applied,
-- so a trial that observes 'factory_default' proves the postgres_baseline seed did not run.
CREATE TABLE widgets (
    id   integer PRIMARY KEY,
    name text    NOT NULL
);

INSERT INTO widgets (id, name) VALUES (1, 'factory_default');
