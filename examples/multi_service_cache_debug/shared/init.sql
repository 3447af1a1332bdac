-- The source of truth, created when app-db first initialises (mounted into /docker-entrypoint-initdb.d).
-- Order 4021 shipped; the cache_poisoned redis seed still holds it as 'processing'.
CREATE TABLE orders (
    id          integer     PRIMARY KEY,
    customer    text        NOT NULL,
    status      text        NOT NULL,
    total_cents integer     NOT NULL,
    updated_at  timestamptz NOT NULL
);

INSERT INTO orders (id, customer, status, total_cents, updated_at) VALUES
    (4017, 'Grace Hopper',  'delivered',  4500, '2026-11-20 09:12:00+00'),
    (4021, 'Ada Lovelace',  'shipped',   12999, '2026-11-28 16:40:00+00'),
    (4022, 'Alan Turing',   'processing', 2350, '2026-11-28 17:05:00+00');

-- Every status update orders-api accepts is recorded here, in the same transaction as the update.
-- The task's gate reads it: a diagnosis must not change an order.
CREATE TABLE order_status_updates (
    id         serial      PRIMARY KEY,
    order_id   integer     NOT NULL REFERENCES orders (id),
    old_status text        NOT NULL,
    new_status text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
