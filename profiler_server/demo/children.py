"""The demo's child processes (server, apps), each the leader of a process group of its own:
Ctrl-C then reaches the demo only, which stops them in order (the apps first, so they flush
to the server; the server last, so it drains), and killing a group also ends the workers a
gunicorn master forked."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path


class DemoError(Exception):
    """Something the demo cannot go on without; the message says what and where to look."""


def answers(url: str) -> bool:
    """True if a GET of `url` answers 200 within a second. Whatever else holds the port (a
    server that does not speak HTTP/1.1 answers with a bad status line) is not an answer."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return False


class Child:
    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exited(self) -> DemoError:
        tail = self.log.read_text(errors="replace")[-2000:]
        return DemoError(f"{self.name} exited with {self.proc.returncode}; {self.log}:\n{tail}")

    def wait_until_answering(self, url: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise self.exited()
            if answers(url):
                return
            time.sleep(0.1)
        raise DemoError(f"{self.name} did not answer {url} within {timeout:.0f} s; see {self.log}")

    def stop(self, grace: float = 15) -> None:
        """SIGTERM and `grace` seconds to finish (hosts flush, the server drains), then
        SIGKILL to whatever is left of the group."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
