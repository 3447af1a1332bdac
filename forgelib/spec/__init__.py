"""Project specs: schemas, loading with positions, semantic checks, digests, stamping."""
