"""The shop core shared by both sample apps: models, SQLite repositories, business rules."""
