"""Which modules the import hook instruments, whichever loader loads them: `--include`
names packages with their submodules, loaders without `get_code` (pytest's assertion
rewriter) are instrumented after the module ran, finders put in front of ours are caught
up with, and the host says at exit which wanted modules have no instrumented function."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tarfile
import textwrap
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ExtensionFileLoader, ModuleSpec, PathFinder
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from profiler_host import rewriter
from profiler_host.filters import ModuleFilter
from profiler_host.functions import FunctionRegistry
from profiler_host.importer import InstrumentingFinder, ModuleSet
from profiler_host.instrumenter import Instrumenter
from tests.helpers import eventually, stored_requests
from tests.processes import ServerProcess, free_port, host, sqlite_server
from tests.test_host_instrumentation import MODULE, instrumented

# the instrumentation tests' module, and a lambda only a list refers to
CORE = MODULE + "\nREGISTRY = [lambda: 1]\n"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`shopapp` (with `core`, `sub.deep`), `shopapp_extra` and `otherapp` on sys.path."""
    root = tmp_path / "site"
    pkg = root / "shopapp"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def top():\n    return 0\n")
    (pkg / "core.py").write_text(textwrap.dedent(CORE))
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("def deep():\n    return 1\n")
    (root / "shopapp_extra.py").write_text("def extra():\n    return 2\n")
    (root / "otherapp.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(root))
    yield pkg
    for name in [m for m in sys.modules if m.split(".")[0].startswith(("shopapp", "otherapp"))]:
        del sys.modules[name]


def hooked(*include: str) -> tuple[Instrumenter, InstrumentingFinder]:
    inst = Instrumenter(ModuleFilter(include), FunctionRegistry())
    finder = InstrumentingFinder(inst)
    finder.install()
    return inst, finder


@pytest.fixture
def unhook() -> Iterator[list]:
    """Uninstalls what a test hooked up (finders, instrumenters), whatever it did."""
    made: list = []
    yield made
    for thing in made:
        if isinstance(thing, InstrumentingFinder):
            thing.uninstall()
        elif isinstance(thing, Instrumenter):
            thing.uninstrument()
        else:
            while thing in sys.meta_path:
                sys.meta_path.remove(thing)


def test_include_names_a_package_and_its_submodules():
    wanted = ModuleFilter(("shopapp",))
    assert wanted("shopapp") and wanted("shopapp.core") and wanted("shopapp.sub.deep")
    assert not wanted("shopapp_extra") and not wanted("other.shopapp")
    globs = ModuleFilter(("shop*",), ("shopapp.sub",))
    assert globs("shopapp_extra") and globs("shopapp.core")
    assert not globs("shopapp.sub") and not globs("shopapp.sub.deep")  # so does exclude
    assert ModuleFilter(("shopapp.*",))("shopapp")  # `pkg.*` still includes pkg
    assert ModuleFilter(("json",))("json.decoder")  # named literally: protected is allowed
    assert not ModuleFilter(("*",))("json.decoder")


def test_include_of_a_package_instruments_its_submodules(package: Path, unhook: list):
    inst, finder = hooked("shopapp")
    unhook += [finder, inst]
    core = importlib.import_module("shopapp.core")
    deep = importlib.import_module("shopapp.sub.deep")
    assert instrumented(core.plain) and instrumented(deep.deep)
    assert instrumented(sys.modules["shopapp"].top)
    assert not instrumented(importlib.import_module("shopapp_extra").extra)


class RewritingHook(MetaPathFinder, Loader):
    """Finder and loader in one, like pytest's assertion rewriter: it compiles and execs the
    modules it wants itself (no `get_code`), flags itself while it does (its finder half
    reads the flag) and remembers what it loaded."""

    def __init__(self, *tops: str) -> None:
        self.tops = tops
        self.running: str | None = None
        self.loaded: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if self.running or fullname.split(".")[0] not in self.tops:
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        return spec_from_file_location(
            fullname, spec.origin, loader=self,
            submodule_search_locations=spec.submodule_search_locations,
        )  # fmt: skip

    def exec_module(self, module) -> None:
        self.running = module.__name__  # rebinds an attribute: state our copy must share
        origin = module.__spec__.origin
        code = compile(Path(origin).read_text(), origin, "exec", dont_inherit=True)
        self.running = None
        self.loaded.append(module.__name__)
        exec(code, module.__dict__)


def assert_core_instrumented(core) -> None:
    for func in (
        core.plain, core.decorated, core.decorated.__wrapped__, core.add_two, core.REGISTRY[0],
        core.Shape.area, core.Shape.name.fget, core.make_adder(1),
    ):  # fmt: skip
        assert instrumented(func), func


def test_modules_a_loader_runs_without_get_code_are_instrumented(package: Path, unhook: list):
    rewriting = RewritingHook("shopapp")
    sys.meta_path.insert(0, rewriting)
    inst, finder = hooked("shopapp")  # in front of it: we ask it, it answers
    unhook += [finder, inst, rewriting]
    core = importlib.import_module("shopapp.core")
    assert_core_instrumented(core)
    assert isinstance(core.__loader__, RewritingHook) and core.__loader__ is not rewriting
    assert rewriting.loaded == ["shopapp", "shopapp.core"] and rewriting.running is None
    assert inst.instrumented_in["shopapp.core"] >= 8 and finder.uninstrumented() == {}


def test_a_finder_put_in_front_later_is_caught_up_with(package: Path, unhook: list):
    """pytest's order: our finder first at start, its rewriter inserted in front later."""
    inst, finder = hooked("shopapp*")
    rewriting = RewritingHook("shopapp", "shopapp_extra")
    sys.meta_path.insert(0, rewriting)
    unhook += [finder, inst, rewriting]
    (package / "__init__.py").write_text("def top():\n    return 0\n\nimport otherapp\n")
    extra = importlib.import_module("shopapp_extra")  # we are not asked
    shopapp = importlib.import_module("shopapp")  # which imports otherapp while it runs
    assert sys.meta_path[0] is finder  # taken back at otherapp's import
    assert instrumented(extra.extra)  # caught up with there
    # shopapp was still running then: if the process ended now, the host would say so
    missed = finder.uninstrumented()
    assert "in front of the import hook, never caught up with" in missed["shopapp"]
    core = importlib.import_module("shopapp.core")
    assert instrumented(shopapp.top)  # caught up with at the next import
    assert rewriting.loaded == ["shopapp_extra", "shopapp", "shopapp.core"]
    assert_core_instrumented(core)  # asked through us, loaded by it
    assert finder.uninstrumented() == {}


class Delegating(MetaPathFinder):
    """A finder that, like ours, asks the rest of `sys.meta_path` for the spec."""

    def __init__(self) -> None:
        self.answered: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("shopapp"):
            return None
        for finder in list(sys.meta_path):
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    self.answered.append(fullname)
                    return spec
        return None


def test_finders_that_ask_each_other_do_not_recurse(package: Path, unhook: list):
    inst, finder = hooked("shopapp")
    delegating = Delegating()
    sys.meta_path.insert(0, delegating)
    unhook += [finder, inst, delegating]
    core = importlib.import_module("shopapp.core")
    assert instrumented(core.plain) and "shopapp.core" in delegating.answered


class ClassLoader:
    """A loader that is a class (as importlib's BuiltinImporter is): no instance to wrap."""

    @classmethod
    def create_module(cls, spec):
        return None

    @classmethod
    def exec_module(cls, module) -> None:
        origin = module.__spec__.origin
        exec(compile(Path(origin).read_text(), origin, "exec"), module.__dict__)


class ClassLoading(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        spec = PathFinder.find_spec(fullname, path) if fullname == "shopapp_extra" else None
        if spec is None:
            return None
        return spec_from_file_location(fullname, spec.origin, loader=ClassLoader)


class LegacyLoader:
    """A loader from before exec_module: `load_module` makes and runs the module."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def load_module(self, fullname: str) -> ModuleType:
        module = sys.modules[fullname] = ModuleType(fullname)
        module.__file__, module.__loader__ = self.origin, self
        exec(compile(Path(self.origin).read_text(), self.origin, "exec"), module.__dict__)
        return module


class LegacyLoading(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        spec = PathFinder.find_spec(fullname, path) if fullname == "shopapp_extra" else None
        return None if spec is None else ModuleSpec(fullname, LegacyLoader(spec.origin))


def test_modules_of_a_loader_without_exec_module_are_instrumented(package: Path, unhook: list):
    inst, finder = hooked("shopapp*")
    unhook += [finder, inst]
    sys.meta_path.insert(1, LegacyLoading())
    unhook.append(sys.meta_path[1])
    with pytest.warns(ImportWarning):  # importlib's, for falling back to load_module
        extra = importlib.import_module("shopapp_extra")
    assert instrumented(extra.extra) and isinstance(extra.__loader__, LegacyLoader)


def test_what_could_not_be_instrumented_is_told_with_the_reason(package: Path, unhook: list):
    inst, finder = hooked("shopapp*")
    unhook += [finder, inst]
    sys.meta_path.insert(1, ClassLoading())  # behind ours, before the path finder
    unhook.append(sys.meta_path[1])
    extra = importlib.import_module("shopapp_extra")
    (reason,) = finder.uninstrumented().values()
    assert "could not be wrapped" in reason
    made = ModuleType("shopapp.made")  # exec'd into a module object by hand
    path = package / "made.py"
    path.write_text("def made():\n    return 1\n\nVALUE = 2\n")
    exec(compile(path.read_text(), str(path), "exec"), made.__dict__)
    sys.modules["shopapp.made"] = made
    importlib.import_module("shopapp.sub")  # the pending module is caught up with here
    assert instrumented(extra.extra)
    missed = finder.uninstrumented()
    assert list(missed) == ["shopapp.made"]
    assert "without the import system" in missed["shopapp.made"]
    assert finder.uninstrumented(skip={"shopapp.made"}) == {}
    importlib.import_module("shopapp.core")
    assert "shopapp.sub" not in finder.uninstrumented()  # defines no function


def test_each_reason_a_wanted_module_went_uninstrumented(
    package: Path, unhook: list, monkeypatch: pytest.MonkeyPatch
):
    inst, finder = hooked("shopapp")
    unhook += [finder, inst]
    deep = package / "sub" / "deep.py"
    spec = spec_from_file_location("shopapp.direct", deep)
    direct = module_from_spec(spec)
    sys.modules["shopapp.direct"] = direct
    spec.loader.exec_module(direct)  # a loader called directly, past every finder
    monkeypatch.setattr(rewriter, "rewrite", raising(RuntimeError("rewriter bug")))
    importlib.import_module("shopapp")
    monkeypatch.setattr(rewriter, "rewrite", raising(rewriter.NotInstrumentable("no")))
    importlib.import_module("shopapp.sub.deep")
    assert finder.uninstrumented() == {
        "shopapp.direct": "SourceFileLoader ran it past the import hook",
        "shopapp.sub.deep": "none of its functions could be rewritten",
        "shopapp": "the rewriter failed on its functions (see the warning above)",
    }


def raising(exc: Exception):
    def rewrite(*args):
        raise exc

    return rewrite


def run_host(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`profiler-host run ARGS` with no server listening (nothing here needs one)."""
    command = host("--server", f"127.0.0.1:{free_port()}", "--flush-timeout", "0s", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_wanted_module_run_past_the_import_hook_is_named_at_exit(tmp_path: Path):
    """`python -m tool` runs tool's code as `__main__` (the default include) through runpy,
    which the import hook never sees as `__main__`: the host says so once."""
    (tmp_path / "tool.py").write_text("def main():\n    return 1\n\nmain()\n")
    done = run_host(tmp_path, "--", sys.executable, "-m", "tool")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ran with no function instrumented") == 1, done.stderr
    assert "  __main__: runpy ran tool as __main__ (--include tool" in done.stderr
    (tmp_path / "job.py").write_text("def main():\n    return 1\n\nmain()\n")
    done = run_host(tmp_path, "--", sys.executable, "job.py")  # the script runner's way
    assert "no function instrumented" not in done.stderr, done.stderr


def test_include_of_an_installed_package_reaches_its_submodules(tmp_path: Path):
    """The filed case: `--include attr` instrumented attr/__init__.py's two functions."""
    count = (
        "import attr, profiler_host.runtime as r\n"
        "print(sum(n for m, n in r.active().instrumenter.instrumented_in.items()"
        " if m.startswith('attr.')))"
    )
    done = run_host(tmp_path, "--include", "attr", "--", sys.executable, "-c", count)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 100


# A package from PyPI that ships a pytest plugin (entry point `pytest11`: typeguard =
# typeguard._pytest_plugin). pytest marks every module of such a distribution for its
# assertion rewriter, which imports the plugin, and so the package, before any test runs.
PLUGIN_DIST, PLUGIN_VERSION = "typeguard", "4.6.0"
CACHE = Path(
    os.environ.get("REQUEST_PROFILER_SDIST_CACHE")
    or Path.home() / ".cache" / "request-profiler" / "sdists"
)
RUN_TIMEOUT = 300


def from_pypi(filename: str, *pip_options: str) -> Path:
    """A pinned file of the plugin's release, from the cache (PyPI on first use)."""
    cached = CACHE / filename
    if not cached.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                *pip_options, "--dest", str(CACHE), f"{PLUGIN_DIST}=={PLUGIN_VERSION}",
            ],
            check=True,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
    assert cached.exists(), f"pip download did not leave {filename} in {CACHE}"
    return cached


def installed_with_its_sources(tmp_path: Path) -> tuple[Path, Path]:
    """The wheel installed into a directory of its own (its metadata is what registers
    the plugin) and the sdist unpacked (its tests): (site directory, sources)."""
    wheel = from_pypi(f"{PLUGIN_DIST}-{PLUGIN_VERSION}-py3-none-any.whl", "--only-binary=:all:")
    sdist = from_pypi(f"{PLUGIN_DIST}-{PLUGIN_VERSION}.tar.gz", "--no-binary=:all:")
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
            "--target", str(site), str(wheel),
        ],
        check=True,
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    return site, tmp_path / "src" / f"{PLUGIN_DIST}-{PLUGIN_VERSION}"


def passed(junit: Path) -> set[str]:
    return {
        f"{case.get('classname')}::{case.get('name')}"
        for case in ET.parse(junit).iter("testcase")
        if not any(case.find(tag) is not None for tag in ("failure", "error", "skipped"))
    }


def run_suite(site: Path, source: Path, junit: Path, prefix: list[str]):
    """The plugin's own suite, plugins autoloaded as a user's pytest run loads them (the
    caller's PYTEST_* settings dropped); its mypy tests need mypy, left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    command = [
        *prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "--ignore=tests/mypy", f"--junitxml={junit}",
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=source, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with sqlite_server(tmp_path) as proc:
        yield proc


@pytest.mark.slow
def test_a_package_with_a_pytest_plugin_is_instrumented_under_its_own_suite(
    tmp_path: Path, server: ServerProcess
):
    site, source = installed_with_its_sources(tmp_path)
    plain = run_suite(site, source, tmp_path / "plain.xml", [])
    expected = passed(tmp_path / "plain.xml")
    assert len(expected) > 400, plain.stdout[-3000:]

    host_run = host(
        "--server", server.target, "--service", "plugin-suite",
        "--include", f"{PLUGIN_DIST},tests", "--whole-process",
        "--max-request-events", "100000000", "--flush-timeout", "60s", "--",
    )  # fmt: skip
    profiled = run_suite(site, source, tmp_path / "profiled.xml", host_run)
    broken = sorted(expected - passed(tmp_path / "profiled.xml"))
    assert not broken, (broken[:20], profiled.stdout[-5000:])
    assert "request-profiler" not in profiled.stderr, profiled.stderr[-3000:]

    def the_run() -> list[dict]:  # its subprocesses are requests of their own
        return [
            r
            for r in stored_requests(server.http, service="plugin-suite")
            if r["route"] == "pytest"
        ]

    (run,) = eventually(the_run, 60)
    assert run["truncated"] is False
    answer = httpx.get(
        f"{server.http}/api/functions", params={"service": "plugin-suite"}, timeout=30
    )
    calls = {f["function"]: f["calls"] for f in answer.json()["functions"]}
    package = [name for name in calls if name.split(".")[0] == PLUGIN_DIST]
    tests = [name for name in calls if name.startswith("tests.")]
    assert len(package) >= 100 and len(tests) >= 300, (len(package), len(tests))
    for name in (
        "typeguard._checkers:check_type_internal",  # loaded by pytest's rewriter
        "tests.test_checkers:TestBytesLike.test_valid",  # a test module pytest rewrote
        "tests.conftest:sample_set",  # a fixture in the rewritten conftest
    ):
        assert calls.get(name), (name, sorted(calls)[:50])


def test_c_extensions_cost_no_search_for_functions(unhook: list, monkeypatch: pytest.MonkeyPatch):
    """An extension module holds no Python function: no heap pass after it ran."""
    monkeypatch.delitem(sys.modules, "xxlimited", raising=False)
    inst, finder = hooked("xxlimited")
    unhook += [finder, inst]
    searched: list[str] = []
    monkeypatch.setattr(inst, "instrument_module", lambda module: searched.append(module))
    module = importlib.import_module("xxlimited")
    assert isinstance(module.__loader__, ExtensionFileLoader)
    assert searched == [] and finder.uninstrumented() == {}


def test_module_like_objects_without_weak_references_are_no_obstacle(
    package: Path, unhook: list
) -> None:
    """`cryptography` puts cffi's `Lib` in sys.modules: a module type that cannot be weakly
    referenced. Installing the hook with it there, and importing after, works as usual."""
    import cryptography.x509  # noqa: F401  (its bindings register `_openssl.lib`)

    lib = next(m for m in list(sys.modules.values()) if type(m).__name__ == "Lib")
    assert isinstance(lib, ModuleType)
    with pytest.raises(TypeError):
        weakref.ref(lib)
    inst, finder = hooked("shopapp")
    unhook += [finder, inst]
    assert instrumented(importlib.import_module("shopapp.core").plain)
    modules = ModuleSet()
    modules.update([lib, sys])
    assert lib in modules and sys in modules and os not in modules
