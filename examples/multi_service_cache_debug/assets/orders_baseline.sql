-- app-db's state is init.sql's orders (shared/init.sql); this seed adds nothing. It exists so app-db
-- can be a reset service: a warm stack restores that state before every trial.
SELECT 1;
