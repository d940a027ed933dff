"""The host's C extensions compile without a single warning on this interpreter, with its own
compiler flags and stricter ones as errors: a deprecated or removed C API shows up here on
the version that deprecates it (`./dev versions` runs this on every supported version)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "ext-modules"
]
STRICT = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
COMPILER = shlex.split(sysconfig.get_config_var("CC") or "cc")


@pytest.mark.skipif(shutil.which(COMPILER[0]) is None, reason=f"no {COMPILER[0]} here")
@pytest.mark.parametrize("extension", EXTENSIONS, ids=[ext["name"] for ext in EXTENSIONS])
def test_extension_compiles_without_warnings(extension: dict, tmp_path: Path) -> None:
    flags = shlex.split(sysconfig.get_config_var("CFLAGS") or "")
    include = sysconfig.get_paths()["include"]
    strict = [*STRICT, "-Werror", "-fPIC", f"-I{include}"]
    for source in extension["sources"]:
        done = subprocess.run(
            [*COMPILER, *flags, *strict, "-c", source, "-o", str(tmp_path / "out.o")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr
