"""PostgreSQL store: connection, migrations, and one module per table family."""
