"""What `sitecustomize` runs in each process started under `profiler-host run`."""

from __future__ import annotations

import logging

from profiler_host import integrations
from profiler_host.runtime import start


def boot() -> None:
    log = logging.getLogger("profiler_host")
    log.addHandler(logging.StreamHandler())
    log.propagate = False
    start()
    integrations.install()
