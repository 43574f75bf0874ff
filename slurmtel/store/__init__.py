"""All SQL lives in this package. The schema itself comes only from the Alembic migrations."""
