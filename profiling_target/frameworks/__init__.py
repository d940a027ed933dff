"""Small apps on real frameworks (FastAPI, Django) whose own machinery the host instruments:
for the framework tests and the overhead benchmarks (extra `frameworks`)."""
