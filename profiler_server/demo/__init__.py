"""`./dev demo` (= `python -m profiler_server.demo`): the profiling server on SQLite, both
sample apps under `profiler-host run` (Flask under gunicorn with 2 workers, Starlette under
uvicorn), a bounded amount of traffic at every route of each, then where to look.

The demo never imports the host library: the apps are separate processes, as in production.
"""
