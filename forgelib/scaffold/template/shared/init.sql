-- The database as the image's entrypoint creates it (once, on a new data directory). The baseline seed
-- then changes it before every trial: a trial that sees 'pending' would prove the seed did not run.
CREATE TABLE orders (
    id     integer PRIMARY KEY,
    status text    NOT NULL
);

INSERT INTO orders (id, status) VALUES (1, 'pending');
