"""What `profiler-host run` instruments when `--include` is not given: the app's own code.

For a `pkg.module:app` argument (gunicorn, uvicorn), that is the app's package and the
packages and modules beside it in the directory it is imported from: a Django project's
apps sit next to the project package that holds `wsgi.py`, a small FastAPI app's modules
next to `main.py`. Without such an argument it is `__main__` (a script's own functions).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from profiler_host.filters import OWN, PROTECTED

_APP_SPEC = re.compile(r"^([A-Za-z_][\w]*)(\.[\w.]+)?:[A-Za-z_][\w.()]*$")
# where gunicorn (`--chdir`) and uvicorn (`--app-dir`) import the app from, if not the cwd
_APP_DIR_FLAGS = ("--chdir", "--app-dir")
MAX_NEIGHBOURS = 50  # more than this beside the app: not a project directory


@dataclass(frozen=True)
class Default:
    """The globs to include, and how to say so at start."""

    globs: tuple[str, ...]
    why: str


def app_package(command: list[str]) -> str | None:
    """`pkg` for a gunicorn/uvicorn app spec like `pkg.module:app` in the command."""
    for arg in command[1:]:
        match = _APP_SPEC.match(arg)
        if match:
            return match.group(1)
    return None


def app_directory(command: list[str], cwd: Path) -> Path:
    """The directory the server imports the app from."""
    for index, arg in enumerate(command):
        for flag in _APP_DIR_FLAGS:
            if arg == flag and index + 1 < len(command):
                return cwd / command[index + 1]
            if arg.startswith(flag + "="):
                return cwd / arg.partition("=")[2]
    return cwd


def default_include(command: list[str], cwd: Path) -> Default:
    package = app_package(command)
    if package is None:
        return Default(("__main__",), "the script's own functions")
    directory = app_directory(command, cwd)
    if not _module_in(directory, package):
        return Default((f"{package}.*",), "the app's package")
    neighbours = _modules_in(directory)
    if len(neighbours) > MAX_NEIGHBOURS:
        return Default((f"{package}.*",), "the app's package")
    return Default(tuple(sorted({package, *neighbours})), f"the app's code in {directory}")


def _module_in(directory: Path, name: str) -> bool:
    return (directory / name / "__init__.py").is_file() or (directory / f"{name}.py").is_file()


def _modules_in(directory: Path) -> list[str]:
    """Packages (with `__init__.py`) and modules in `directory`, but the standard library's,
    the profiler's and its dependencies' names (instrumented only when named)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    names = [
        entry.stem if entry.suffix == ".py" else entry.name
        for entry in entries
        if (entry.suffix == ".py" and entry.is_file()) or (entry / "__init__.py").is_file()
    ]
    never = OWN + tuple(PROTECTED) + tuple(sys.stdlib_module_names)
    return [name for name in names if name.isidentifier() and name not in never]
