"""The ingest worker's parts: the group a transaction holds, the session lifecycle, the
housekeeping done on its own schedule, and retention on its own thread."""
