"""Odd but realistic code the rewriter must leave behaving exactly as before (issue 3).

Each `case_*` function takes no arguments and returns plain data (never objects of classes
defined here: the plain and the instrumented copy of this module have different classes)
or raises. `load()` builds a fresh copy of this module from its source, plain or with every
function code object rewritten, so the same source runs both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import inspect
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from profiler_host import rewriter

LONG_FILENAME = "<torture long jumps>"
LONG_STATEMENTS = 400  # enough for jumps over more than 255 code units (EXTENDED_ARG)
# Cases that run at the recursion limit: not under sys.settrace (the tracer's frames would
# overflow), and a sampled run's hooks may overflow there too (see case_recursion_limit).
NEAR_RECURSION_LIMIT = frozenset({"case_recursion_limit"})


# -- building the plain and the instrumented copy ---------------------------------------


def instrument_tree(
    code: types.CodeType, hooks: rewriter.Hooks, functions: dict[int, types.CodeType]
) -> types.CodeType:
    """Rewrites every function code object inside `code`, innermost first (the rewriter
    leaves nested code objects alone); `functions` maps the ids given out to the originals."""
    consts = tuple(
        instrument_tree(const, hooks, functions) if isinstance(const, types.CodeType) else const
        for const in code.co_consts
    )
    code = code.replace(co_consts=consts)
    if not rewriter.instrumentable(code):
        return code
    fid = len(functions) + 1
    functions[fid] = code
    return rewriter.rewrite(code, fid, hooks)


def load(
    name: str, hooks: rewriter.Hooks | None
) -> tuple[types.ModuleType, dict[int, types.CodeType]]:
    """A fresh copy of this module registered as `name` (so pickle finds its classes),
    every function instrumented with `hooks` unless None; also the function ids."""
    module = types.ModuleType(name)
    module.__file__ = __file__
    sys.modules[name] = module
    functions: dict[int, types.CodeType] = {}
    sources = [(__file__, Path(__file__).read_text()), (LONG_FILENAME, long_jumps_source())]
    for filename, source in sources:
        code = compile(source, filename, "exec")
        if hooks is not None:
            code = instrument_tree(code, hooks, functions)
        exec(code, module.__dict__)
    return module, functions


def long_jumps_source(statements: int = LONG_STATEMENTS) -> str:
    """A function and a generator whose loop bodies are too long for one-byte jumps."""
    body = []
    for n in range(statements):
        if n % 3 == 0:
            body.append(f"        if i % {n % 7 + 2}:\n            total += {n}")
        elif n % 3 == 1:
            body.append(f"        total ^= i * {n}")
        else:
            body.append(f"        total = (total + {n}) % 1000003")
    loop = "\n".join(body)
    return (
        "def long_jumps(n):\n"
        "    total = 0\n"
        "    for i in range(n):\n"
        f"{loop}\n"
        "        if total < 0:\n"
        "            break\n"
        "    return total\n"
        "\n"
        "def long_jumps_generator(n):\n"
        "    total = 0\n"
        "    for i in range(n):\n"
        f"{loop}\n"
        "        try:\n"
        "            sent = yield total\n"
        "        except KeyError:\n"
        "            sent = -1\n"
        "        total += sent or 0\n"
        "    return total\n"
        "\n"
        "def case_extended_arg_jumps():\n"
        "    gen = long_jumps_generator(5)\n"
        "    seen = [next(gen), gen.send(3), gen.throw(KeyError), next(gen)]\n"
        "    seen.extend(gen)\n"
        "    return long_jumps(7), seen\n"
    )


# -- closures, nonlocal, locals() ------------------------------------------------------


def make_counter(start: int) -> Callable[[], int]:
    count = start

    def increment() -> int:
        nonlocal count
        count += 1
        return count

    return increment


def make_adders(base):
    def outer(step):
        def inner(x):
            return base + step + x

        return inner

    return [outer(step) for step in range(3)]


def shadowing(x):
    def reader():
        return x  # x is a cell of shadowing's argument: MAKE_CELL before RESUME

    x = x * 2
    return reader


def case_closures():
    counter = make_counter(10)
    adders = make_adders(100)
    return (
        [counter() for _ in range(3)],
        [add(1) for add in adders],
        shadowing(4)(),
        counter.__code__.co_freevars,
        [cell.cell_contents for cell in counter.__closure__],
    )


def case_locals():
    a = 1
    b = [a]

    def uses_b():
        return b

    first = list(locals())
    c = a + len(uses_b())
    second = dict(locals())
    second.pop("uses_b")
    frame_locals = list(sys._getframe().f_locals)
    return first, sorted(second.items()), frame_locals, c, vars().keys() == locals().keys()


def generator_locals(n):
    total = 0
    for i in range(n):
        yield list(locals())
        total += i
    yield sorted(locals().items())


def case_generator_locals():
    gen = generator_locals(2)
    first = next(gen)
    frame_locals = sorted(gen.gi_frame.f_locals)
    return first, frame_locals, list(gen)


# -- classes: super(), classmethod, staticmethod, property, pickling -------------------


class Base:
    registry: ClassVar[list[str]] = []

    def __init_subclass__(cls, tag: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Base.registry.append(f"{cls.__name__}:{tag}")

    def __init__(self, value: int) -> None:
        self.value = value

    def describe(self) -> str:
        return f"Base({self.value})"

    @classmethod
    def make(cls, value: int) -> Base:
        return cls(value)

    @staticmethod
    def double(x: int) -> int:
        return x * 2

    @property
    def doubled(self) -> int:
        return self.double(self.value)

    @doubled.setter
    def doubled(self, new: int) -> None:
        self.value = new // 2

    @doubled.deleter
    def doubled(self) -> None:
        self.value = 0


class Child(Base, tag="child"):
    def __init__(self, value: int, extra: str = "x") -> None:
        super().__init__(value)
        self.extra = extra

    def describe(self) -> str:
        return "Child<" + super().describe() + ">"

    @classmethod
    def make(cls, value: int) -> Child:
        made = super().make(value + 1)
        made.extra = "made"
        return made

    def walk(self):
        yield super().describe()
        yield from [super().describe(), __class__.__name__]

    def late_super(self):
        def helper():
            return __class__  # the implicit cell super() uses

        return helper().__name__, super().double(3)


class GrandChild(Child, tag="grand"):
    def describe(self) -> str:
        return "Grand" + super().describe()


def case_classes():
    grand = GrandChild.make(4)
    child = Child(3)
    child.doubled = 10
    before_delete = child.doubled
    del child.doubled
    return (
        grand.describe(),
        grand.extra,
        list(child.walk()),
        child.late_super(),
        before_delete,
        child.value,
        Base.double(21),
        GrandChild.double(1),
        list(Base.registry),
    )


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int) -> None:
        self.a = a
        self.b = b

    def __getstate__(self) -> dict[str, int]:
        return {"a": self.a, "b": self.b, "sum": self.a + self.b}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.a = state["a"]
        self.b = state["sum"] - state["a"]


class Reduced:
    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __reduce__(self) -> tuple:
        return (type(self), self.parts)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Pair(NamedTuple):
    left: int
    right: str


class Outer:
    class Inner:
        def __init__(self) -> None:
            self.tag = "inner"


def case_pickling():
    objects = [Point(1, -2), Slotted(2, 5), Reduced("a", "b"), Color.GREEN, Pair(1, "r")]
    objects.append(Outer.Inner())
    seen = []
    for obj in objects:
        for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
            copy = pickle.loads(pickle.dumps(obj, protocol))
            state = copy.name if isinstance(copy, enum.Enum) else copy.__getstate__()
            seen.append((type(copy).__qualname__, type(copy) is type(obj), repr(state)))
    return seen, Point(3, 4).norm1(), pickle.loads(pickle.dumps(Slotted(1, 1))).b


# -- decorators ------------------------------------------------------------------------


def logged(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        wrapper.calls.append(args)
        return func(*args, **kwargs)

    wrapper.calls = []
    return wrapper


def retry(times: int):
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for attempt in range(times):
                try:
                    return func(*args, attempt=attempt, **kwargs)
                except ValueError:
                    if attempt == times - 1:
                        raise
            return None

        return wrapper

    return decorate


@logged
def add(a: int, b: int = 2, *rest: int, scale: int = 1, **options: Any) -> int:
    """Adds things."""
    return (a + b + sum(rest)) * scale


@retry(3)
def flaky(limit: int, *, attempt: int = 0) -> int:
    if attempt < limit:
        raise ValueError(f"attempt {attempt}")
    return attempt


@functools.cache
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def case_decorators():
    calls_before = len(add.calls)
    fib.cache_clear()  # every run traces the same calls
    flaky_error = None
    try:
        flaky(5)
    except ValueError as e:
        flaky_error = str(e)
    return (
        add(1, 2, 3, scale=2),
        add.calls[calls_before:],
        add.__name__,
        add.__doc__,
        add.__wrapped__.__qualname__,
        str(inspect.signature(add)),
        flaky(2),
        flaky_error,
        fib(60),
    )


@contextlib.contextmanager
def managed(log: list[str], name: str) -> Iterator[str]:
    log.append(f"enter {name}")
    try:
        yield name.upper()
    except KeyError as e:
        log.append(f"handled {e}")
    finally:
        log.append(f"exit {name}")


def case_context_managers():
    log: list[str] = []
    with managed(log, "a") as a, managed(log, "b") as b:
        log.append(a + b)
    with managed(log, "c"):
        raise KeyError("inside")
    try:
        with managed(log, "d"):
            raise ValueError("escapes")
    except ValueError as e:
        log.append(repr(e))
    return log


# -- generators ------------------------------------------------------------------------


def echo(log: list):
    """Yields what it is sent; survives KeyError thrown in, then yields again."""
    received = None
    try:
        while True:
            try:
                received = yield received
                log.append(("got", received))
            except KeyError as e:
                log.append(("caught", e.args))
                received = "recovered"
    except GeneratorExit:
        log.append("closing")
        raise
    finally:
        log.append("finally")


def sub_returning_on_throw(log: list):
    try:
        yield "sub 1"
        yield "sub 2"
    except ValueError as e:
        log.append(("sub caught", str(e)))
        return "sub result"
    return "sub done"


def delegator(log: list):
    result = yield from sub_returning_on_throw(log)
    log.append(("delegated result", result))
    echo_result = yield from echo(log)
    log.append(("never", echo_result))


def states(gen) -> tuple:
    yielded_from = gen.gi_yieldfrom
    return (
        inspect.getgeneratorstate(gen),
        None if yielded_from is None else yielded_from.__name__,
        gen.gi_running,
        gen.gi_frame is None or gen.gi_frame.f_lineno,
    )


def case_generators():
    log: list = []
    gen = echo(log)
    seen = [states(gen), next(gen), states(gen), gen.send(1), gen.throw(KeyError("k"))]
    seen.append(gen.send(2))
    gen.close()
    seen.append(states(gen))
    outer = delegator(log)
    seen += [next(outer), states(outer), outer.throw(ValueError("boom")), states(outer)]
    seen += [outer.send("to echo"), outer.throw(KeyError("deep")), states(outer)]
    try:
        outer.throw(RuntimeError("stop"))
    except RuntimeError as e:
        seen.append(("outer raised", str(e), states(outer)))
    return seen, log


def take_one(gen):
    """A plain call resuming a delegating generator: the generator's frame gives control
    away through `yield from` (no hook runs), then this call exits."""
    return next(gen)


def case_yield_from_through_plain_call():
    log: list = []
    outer = delegator(log)
    seen = [take_one(outer), take_one(outer), take_one(outer), states(outer)]
    outer.close()
    return seen, log


def stubborn():
    while True:
        try:  # noqa: SIM105 - a handler around the yield is the case
            yield "again"
        except GeneratorExit:
            pass


def returns_in_finally():
    try:
        yield 1
    finally:
        return "swallowed"  # noqa: B012 - the point of the case


def case_generator_edges():
    out = []
    gen = stubborn()
    next(gen)
    try:
        gen.close()
    except RuntimeError as e:
        out.append(str(e))
    with contextlib.suppress(ValueError):
        gen.throw(ValueError)  # finishes it: the GC would otherwise close it again
    out.append(inspect.getgeneratorstate(gen))
    gen = returns_in_finally()
    next(gen)
    try:
        gen.throw(ValueError("lost"))
    except StopIteration as stop:
        out.append(("stop", stop.value))
    gen = echo([])
    out.append(list(zip(gen, range(3), strict=False)))
    gen.close()
    empty = iter(())
    out.append(next((x for x in empty), "default"))
    return out


# -- exceptions ------------------------------------------------------------------------


def descend(depth: int) -> int:
    if depth == 0:
        raise LookupError("bottom")
    return descend(depth - 1) + 1


def wrap_errors(depth: int) -> int:
    try:
        return descend(depth)
    except LookupError as e:
        raise RuntimeError("wrapped") from e


def case_deep_raise():
    """Escapes the case: the harness compares the traceback."""
    return wrap_errors(25)


def case_exception_chains():
    out = []
    try:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("during handling")  # noqa: B904 - implicit context wanted
    except ValueError as e:
        out.append((type(e.__context__).__name__, e.__suppress_context__))
    try:
        wrap_errors(3)
    except RuntimeError as e:
        out.append((str(e.__cause__), len(list(_tb_names(e.__cause__.__traceback__)))))
    try:
        raise TypeError("with notes")
    except TypeError as e:
        e.add_note("a note")
        out.append(e.__notes__)
    return out


def _tb_names(tb: types.TracebackType | None) -> Iterator[str]:
    while tb is not None:
        yield tb.tb_frame.f_code.co_name
        tb = tb.tb_next


def return_in_finally(flag: bool):
    for i in range(3):
        try:
            if flag:
                raise ValueError(i)
            return ("try", i)
        finally:
            if i == 1:
                return ("finally", i)  # noqa: B012 - the point of the case
            continue  # noqa: B012


def break_in_finally():
    total = []
    while True:
        try:
            total.append(len(total))
            raise KeyError("swallowed by break")
        finally:
            if len(total) > 2:
                break  # noqa: B012
            continue  # noqa: B012
    return total


def case_pickled_by_value():
    """cloudpickle and dill (joblib/loky, Dask, Ray) take closures and lambdas by value,
    their code's constants with them: the gate, the hooks and the function id the rewriter
    adds must pickle too, in a sampled request as outside one."""
    import cloudpickle
    import dill

    base = 3

    def scaled(n):
        return [base * i for i in range(n)]

    square = lambda x: x * x  # noqa: E731
    return [p.loads(p.dumps(f))(4) for p in (cloudpickle, dill) for f in (scaled, square)]


def case_wide_columns():
    """Instructions past columns 127 and 255 (a long f-string, a lookup that fails there):
    their locations take the line table's long form. `bytecode` wrote them as raw bytes
    that read as entry headers: a table longer than the code, heap corruption once traced."""
    value = 7
    text = f"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{value!r}"  # noqa: E501
    table = {"present": text}
    found = [table["present"], f"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{value + 1}"] + [table["yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"]]  # noqa: E501, RUF005 # fmt: skip
    return found


def except_as_in_finally_loop(n: int) -> list:
    """The case that segfaulted with `bytecode`'s own handler depths (docs/host.md)."""
    seen = []
    for i in range(n):
        try:
            try:
                if i % 2:
                    raise ValueError(i)
                seen.append(("ok", i))
            except ValueError as err:
                seen.append(("caught", err.args))
        finally:
            seen.append(("finally", i))
            continue  # noqa: B012 - the point of the case
    return seen


def case_finally_flow():
    return (
        return_in_finally(False),
        return_in_finally(True),
        break_in_finally(),
        except_as_in_finally_loop(5),
    )


def case_except_star():
    out = []
    try:
        raise ExceptionGroup(
            "many", [ValueError("v1"), TypeError("t"), ExceptionGroup("inner", [ValueError("v2")])]
        )
    except* ValueError as group:
        out.append(("values", sorted(str(e) for e in _leaves(group))))
    except* TypeError as group:
        out.append(("types", [str(e) for e in group.exceptions]))
    try:
        try:
            raise ExceptionGroup("outer", [KeyError("k"), OSError("o")])
        except* KeyError:
            out.append("keys handled")
    except ExceptionGroup as rest:
        out.append(("rest", [type(e).__name__ for e in rest.exceptions]))
    return out


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def classify(value: Any) -> str:
    match value:
        case {"kind": "point", "x": int(x), "y": int(y)} if x == y:
            return f"diagonal {x}"
        case {"kind": "point", **rest}:
            return f"point {sorted(rest)}"
        case Point(x=0, y=y):
            return f"on y axis at {y}"
        case Point(x, y):
            return f"point {x},{y}"
        case [first, *middle, last]:
            return f"seq {first}..{last} ({len(middle)})"
        case str() | bytes() as text:
            return f"text {text!r}"
        case Color.RED:
            return "red"
        case _:
            return "other"


def case_match():
    values = [
        {"kind": "point", "x": 2, "y": 2},
        {"kind": "point", "x": 1, "z": 3},
        Point(0, 5),
        Point(1, 2),
        [1, 2, 3, 4],
        "abc",
        b"x",
        Color.RED,
        Color.GREEN,
        3.5,
    ]
    return [classify(v) for v in values]


def recurse_forever(n: int) -> int:
    return recurse_forever(n + 1) + 1


def _depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def case_recursion_limit():
    """RecursionError is raised and caught, and the program goes on. Only its type is
    compared: when sampled, the hooks' frames make it arrive a frame or two earlier, raised
    inside a hook (the hook's own frame cannot be pushed, so it cannot swallow it)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + 150)
    try:
        try:
            recurse_forever(0)
        except RecursionError as e:
            caught = type(e).__name__
    finally:
        sys.setrecursionlimit(old)
    return caught, descend_safely(30)


def descend_safely(depth: int) -> int:
    return 0 if depth == 0 else descend_safely(depth - 1) + 1


def case_traceback_inside():
    """Stacks seen from inside: extract_stack and f_back chains."""

    def leaf():
        frame = sys._getframe()
        stack = [(f.function, f.lineno, f.positions) for f in inspect.stack(0)[:3]]
        return stack, frame.f_back.f_code.co_name, frame.f_lineno

    def middle():
        return leaf()

    return middle()


def deep_yields(log: list):
    """Yields with values under them on the stack: in a call's arguments, a for loop,
    a with block, an except handler, a finally running on an exception."""
    with contextlib.nullcontext("cm"):
        for i in range(2):
            try:
                raise KeyError(i)
            except KeyError as e:
                got = [i, (yield i), {"k": (yield -i), **{"e": e.args}}]
                log.append(got)
    try:
        return (yield from deep_sub(len(log))), (yield "last")
    finally:
        log.append((yield "in finally"))


def deep_sub(n: int):
    got = yield n
    return got


def case_deep_yields():
    log: list = []
    gen = deep_yields(log)
    out = [next(gen)]
    try:
        while True:
            out.append(gen.send(len(out)))
    except StopIteration as stop:
        out.append(("returned", stop.value))
    gen = deep_yields(log)
    out += [next(gen), *(gen.send(sent) for sent in "abcde")]
    out.append(gen.throw(ValueError("into the return")))
    try:
        gen.send("to finally")
    except ValueError as e:
        out.append(("raised after finally", str(e)))
    return out, log


def empty_generator():
    return
    yield  # makes it a generator; unreachable


def raises_stop_iteration():
    yield 1
    raise StopIteration("inside")  # turned into RuntimeError (PEP 479)


def case_generator_errors():
    out = []
    try:
        list(raises_stop_iteration())
    except RuntimeError as e:
        out.append((str(e), type(e.__cause__).__name__))
    gen = echo([])
    gen.close()  # never started: no frame ran
    out.append(inspect.getgeneratorstate(gen))
    log: list = []
    abandoned = echo(log)
    next(abandoned)
    del abandoned  # closed by its refcount reaching zero, suspended at its yield
    out += [log, list(empty_generator())]
    running = []

    def reenter():
        running.append(inspect.getgeneratorstate(inner))
        yield next(inner)

    inner = reenter()
    try:
        next(inner)
    except ValueError as e:
        out.append((str(e), running))
    return out


def raiser(message: str) -> None:
    raise ValueError(message)


def case_exc_info():
    """Exceptions raised and caught in callees leave the handled exception alone."""
    out = []
    try:
        raise KeyError("outer")
    except KeyError:
        try:
            raiser("inner")
        except ValueError as e:
            out.append(repr(e.__context__))
        out.append(repr(sys.exc_info()[1]))
        with contextlib.suppress(ValueError):
            raiser("suppressed")
        out.append(repr(sys.exception()))
    out.append(sys.exc_info())
    return out


def interrupted(kind: type[BaseException]) -> None:
    raise kind("user code")


def case_base_exceptions():
    """BaseExceptions raised by user code pass the catch-all handler unchanged."""
    out = []
    for kind in (KeyboardInterrupt, SystemExit, GeneratorExit):
        try:
            interrupted(kind)
        except BaseException as e:
            out.append((type(e).__name__, e.args, e.__context__))
    return out


def defaults(a, b=[], *, c={}, d=lambda x=3: x * 2):  # noqa: B006 - shared defaults wanted
    b.append(a)
    c[a] = len(b)
    return list(b), dict(c), d(), (lambda: a)()


@types.coroutine
def bare_yield(value):
    """A generator-based coroutine (CO_ITERABLE_COROUTINE): awaitable, yields to the loop."""
    sent = yield value
    return sent


async def awaits_bare_yield() -> Any:
    return await bare_yield(None)


def case_functions():
    defaults.__defaults__[0].clear()  # every run starts from the same shared defaults
    defaults.__kwdefaults__["c"].clear()
    results = [defaults(1), defaults(2, [], c={})]
    key = sorted(["bb", "a", "ccc"], key=lambda s: -len(s))
    late_bound = [f() for f in [lambda: i for i in range(3)]]  # noqa: B023 - late binding
    coroutine = awaits_bare_yield()
    yielded = coroutine.send(None)
    try:
        coroutine.send("sent")
    except StopIteration as stop:
        finished = stop.value
    return results, key, late_bound, yielded, finished, asyncio.run(awaits_bare_yield())


# -- asyncio ---------------------------------------------------------------------------


async def leaf_coroutine(log: list, name: str) -> str:
    await asyncio.sleep(0)
    log.append(name)
    return name.upper()


async def chained(log: list) -> str:
    """An await chain whose innermost await is on asyncio's (uninstrumented) sleep."""
    return await leaf_coroutine(log, "chained")


class Resource:
    def __init__(self, log: list, suppress: bool) -> None:
        self.log = log
        self.suppress = suppress

    async def __aenter__(self) -> Resource:
        await asyncio.sleep(0)
        self.log.append("aenter")
        return self

    async def __aexit__(self, kind, value, tb) -> bool:
        await asyncio.sleep(0)
        self.log.append(("aexit", None if kind is None else kind.__name__))
        return self.suppress


class Countdown:
    def __init__(self, n: int) -> None:
        self.n = n

    def __aiter__(self) -> Countdown:
        return self

    async def __anext__(self) -> int:
        await asyncio.sleep(0)
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return self.n


async def ticker(log: list, limit: int):
    try:
        for i in range(limit):
            try:
                received = yield i
                log.append(("ticker got", received))
            except KeyError as e:
                log.append(("ticker caught", str(e)))
                yield "recovered"
            await asyncio.sleep(0)
    finally:
        await asyncio.sleep(0)
        log.append("ticker finalised")


async def async_main(log: list) -> list:
    out = [await leaf_coroutine(log, "first")]
    async with Resource(log, suppress=True):
        raise KeyError("suppressed")
    try:
        async with Resource(log, suppress=False):
            raise ValueError("passes")
    except ValueError as e:
        out.append(str(e))
    out.append([n async for n in Countdown(3)])
    async for n in Countdown(2):
        out.append(n)
    gen = ticker(log, 5)
    out.append(await gen.asend(None))
    out.append(await gen.asend("hello"))
    out.append(await gen.athrow(KeyError("k")))
    out.append(await gen.asend(None))
    await gen.aclose()
    out.append(await anext(gen, "exhausted"))
    coroutine = leaf_coroutine(log, "inspected")
    out.append(inspect.getcoroutinestate(coroutine))
    out.append(await coroutine)
    out.append(inspect.getcoroutinestate(coroutine))
    return out


def case_async_protocols():
    log: list = []
    return asyncio.run(async_main(log)), log


async def abandoned_generator(keep: list, log: list) -> None:
    gen = ticker(log, 10)
    keep.append(gen)
    async for value in gen:
        if value == 2:
            break


def case_asyncgen_finalised_by_loop():
    """The loop's shutdown_asyncgens closes a generator still suspended at its yield."""
    keep: list = []
    log: list = []
    asyncio.run(abandoned_generator(keep, log))
    return log, keep[0].ag_frame is None


async def awaits_forever(log: list, name: str) -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError as e:
        log.append((name, "cancelled", e.args))
        await asyncio.sleep(0)
        log.append((name, "cleaned up"))
        raise


async def observe_await(log: list) -> list:
    task = asyncio.create_task(awaits_forever(log, "observed"))
    await asyncio.sleep(0)
    coroutine = task.get_coro()
    awaited = coroutine.cr_await
    seen = [inspect.getcoroutinestate(coroutine), type(awaited).__name__]
    seen.append((coroutine.cr_frame.f_lineno, awaited.cr_frame.f_code.co_name))
    task.cancel("stop please")
    try:
        await task
    except asyncio.CancelledError as e:
        seen.append(("task cancelled", e.args, task.cancelled()))
    seen.append(inspect.getcoroutinestate(coroutine))
    return seen


def case_task_cancellation():
    log: list = []
    return asyncio.run(observe_await(log)), log


async def with_timeouts(log: list) -> list:
    out = []
    try:
        async with asyncio.timeout(0):
            await awaits_forever(log, "timed out")
    except TimeoutError as e:
        out.append(("timeout", type(e).__name__, type(e.__context__).__name__))
    async with asyncio.timeout(None) as cm:
        out.append(await leaf_coroutine(log, "in time"))
    out.append(cm.expired())
    try:
        await asyncio.wait_for(awaits_forever(log, "wait_for"), 0)
    except TimeoutError:
        out.append("wait_for timed out")
    return out


def case_timeouts():
    log: list = []
    return asyncio.run(with_timeouts(log)), log


async def fails_after(delay_steps: int, message: str) -> None:
    for _ in range(delay_steps):
        await asyncio.sleep(0)
    raise ValueError(message)


async def task_group_failure(log: list) -> list:
    out = []
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(awaits_forever(log, "sibling"))
            group.create_task(fails_after(2, "first failure"))
            group.create_task(fails_after(2, "second failure"))
            group.create_task(leaf_coroutine(log, "finishes"))
    except* ValueError as eg:
        out.append(sorted(str(e) for e in eg.exceptions))
    return out


def case_task_group():
    log: list = []
    return asyncio.run(task_group_failure(log)), log


async def gathering(log: list) -> list:
    results = await asyncio.gather(
        leaf_coroutine(log, "a"), fails_after(1, "in gather"), return_exceptions=True
    )
    out = [[r if isinstance(r, str) else repr(r) for r in results]]
    slow = asyncio.ensure_future(leaf_coroutine(log, "slow"))
    try:
        await asyncio.gather(fails_after(0, "propagates"), slow)
    except ValueError as e:
        out.append(str(e))
    out.append(await slow)
    out.append(await asyncio.to_thread(descend_safely, 5))
    return out


def case_gather():
    log: list = []
    return asyncio.run(gathering(log)), log


def case_async_raise():
    """Escapes the case through asyncio.run: the harness compares the traceback."""
    return asyncio.run(fails_after(3, "escapes asyncio.run"))


def cleanup_step(log: list, what: str) -> str:
    log.append(what)
    return what


def resource(log: list):
    """A generator suspended at its yield whose handlers call functions when thrown into."""
    try:
        yield cleanup_step(log, "opened")
    except KeyError as e:
        cleanup_step(log, f"handled {e.args[0]}")
        yield "after the throw"
    finally:
        cleanup_step(log, "closed")


@contextlib.asynccontextmanager
async def async_resource(log: list):
    """FastAPI's `yield` dependencies: an exception leaving the block is thrown in at the
    yield, and the handler awaits (hands work to a thread) before it re-raises."""
    try:
        yield cleanup_step(log, "entered")
    except LookupError as e:
        await asyncio.sleep(0)
        log.append(await asyncio.to_thread(cleanup_step, log, f"cleaned {type(e).__name__}"))
        raise
    finally:
        await asyncio.sleep(0)
        cleanup_step(log, "exited")


async def raise_through(log: list) -> list:
    try:
        async with async_resource(log):
            raise KeyError("from the block")
    except KeyError as e:
        log.append(repr(e))
    return log


def case_handlers_of_thrown_in_frames():
    """throw(), close() and athrow() resume a frame suspended at a yield with no hook; what
    its handlers call must nest under it (the `thrown` hook)."""
    log: list = []
    gen = resource(log)
    seen = [next(gen), gen.throw(KeyError("k"))]
    gen.close()
    other = resource(log)
    next(other)
    other.close()
    return seen, log, asyncio.run(raise_through([]))


# -- what the test inspects on functions, not by running them --------------------------


def sample_callables(module: types.ModuleType) -> dict[str, Callable]:
    """Functions, closures, methods, properties' getters and wrappers of this module."""
    found: dict[str, Callable] = {}
    for name, value in vars(module).items():
        if isinstance(value, types.FunctionType) and value.__code__.co_filename == __file__:
            found[name] = value
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for attr, member in vars(value).items():
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if (
                    isinstance(member, types.FunctionType)
                    and member.__code__.co_filename == __file__
                ):
                    found[f"{name}.{attr}"] = member
    found["counter"] = module.make_counter(1)
    found["adder"] = module.make_adders(1)[2]
    found["reader"] = module.shadowing(1)
    return found


# -- what differs between CPython versions (profiler_host/layouts, docs/host.md) --------


def constant_returns(flag: int):
    """`return <constant>` is RETURN_CONST from 3.12, with nothing on the stack below it."""
    for i in range(3):
        if i == flag:
            return "in loop"
    with contextlib.nullcontext():
        if flag == 3:
            return None
    try:
        if flag == 4:
            return 4.5
    finally:
        pass
    return ("end", flag)


def generator_returning_constant():
    yield 1
    return "generator result"  # RETURN_CONST inside the implicit StopIteration handler


async def coroutine_returning_constant() -> str:
    await asyncio.sleep(0)
    return "coroutine result"


def case_return_const():
    gen = generator_returning_constant()
    seen = [next(gen)]
    try:
        next(gen)
    except StopIteration as stop:
        seen.append(stop.value)
    return (
        [constant_returns(flag) for flag in range(6)],
        seen,
        asyncio.run(coroutine_returning_constant()),
    )


def no_handlers(log: list):
    """No try: from 3.12 its yields are inside only the implicit StopIteration handler, and
    3.13's close() clears such a frame without throwing GeneratorExit in (RESUME's DEPTH1
    bit; 3.12's YIELD_VALUE oparg meant the same)."""
    log.append("started")
    yield 1
    log.append("resumed")
    yield 2
    log.append("never")


def one_handler(log: list):
    try:
        yield 1
    finally:
        log.append("finally ran")


def case_close_without_handlers():
    log: list = []
    gen = no_handlers(log)
    seen = [next(gen), gen.close(), inspect.getgeneratorstate(gen)]
    gen = no_handlers(log)
    seen += [next(gen), next(gen)]
    del gen  # finalised by its refcount, suspended at its second yield
    gen = one_handler(log)
    seen += [next(gen), gen.close()]
    gen = no_handlers(log)
    next(gen)
    try:
        gen.throw(KeyError("thrown"))
    except KeyError as e:
        seen.append(("escaped", e.args, inspect.getgeneratorstate(gen)))
    return seen, log


class NotAGenerator:
    """An iterator without throw(): `yield from` it, thrown into, raises at the yield."""

    def __init__(self) -> None:
        self.items = [1, 2]

    def __iter__(self) -> NotAGenerator:
        return self

    def __next__(self) -> int:
        if not self.items:
            raise StopIteration("exhausted")
        return self.items.pop(0)


def returns_on_throw():
    try:
        yield "inner"
    except ValueError as e:
        return f"returned on {e}"


def delegates_to(make: Callable[[], Any], log: list):
    result = yield from make()
    log.append(("result", result))
    yield "after"


def case_throw_into_delegation():
    """3.12 moved the end of a throw into `yield from`/`await` into bytecode: the handler
    around the delegating yield (CLEANUP_THROW) takes the delegate's StopIteration value
    and jumps to END_SEND, or re-raises."""
    log: list = []
    seen = []
    gen = delegates_to(returns_on_throw, log)
    seen += [next(gen), gen.gi_yieldfrom.__name__, gen.throw(ValueError("v")), gen.gi_yieldfrom]
    gen = delegates_to(NotAGenerator, log)
    seen.append(next(gen))
    try:
        gen.throw(KeyError("k"))
    except KeyError as e:
        seen.append(("raised", e.args, inspect.getgeneratorstate(gen)))
    gen = delegates_to(returns_on_throw, log)
    next(gen)
    try:
        gen.throw(TypeError("t"))
    except TypeError as e:
        seen.append(("passed through", e.args))
    return seen, log


async def async_gen_wrapped(log: list):
    """Each yield of an async generator wraps its value (3.12: CALL_INTRINSIC_1
    ASYNC_GEN_WRAP right before YIELD_VALUE)."""
    for n in range(3):
        log.append(n)
        yield +n  # UNARY_POSITIVE is an intrinsic too from 3.12


def stops_iteration():
    yield 1
    next(iter(()))  # StopIteration inside a generator: the implicit handler's intrinsic


async def intrinsics(log: list) -> list:
    out = [value async for value in async_gen_wrapped(log)]
    args = [1, 2]
    out.append(tuple([*args, *args]))  # LIST_TO_TUPLE
    try:
        list(stops_iteration())
    except RuntimeError as e:
        out.append((str(e), type(e.__cause__).__name__))
    return out


def case_call_intrinsic():
    log: list = []
    return asyncio.run(intrinsics(log)), log


def comprehension_locals(values: list):
    """PEP 709 (3.12): list, set and dict comprehensions run in their function's frame;
    their variables are the function's locals, saved and restored around them."""
    x = "outer x"
    inside = [sorted(locals()) for x in values[:1]]
    frames = [sorted(sys._getframe().f_locals) for y in values[:1]]
    squares = {v: v * v for v in values}
    nested = [[a * b for b in values] for a in values]
    kept = x
    try:
        [1 // v for x in [x] for v in values]  # raises inside the comprehension
    except ZeroDivisionError as e:
        failed = (type(e).__name__, x)
    return inside, frames, squares, nested, kept, failed, sorted(locals())


def comprehension_cells(x: int):
    """A comprehension variable closed over is a cell inside the comprehension only (apart
    from comprehension_locals: `locals()` in a comprehension over a cell of its function
    crashes 3.13.0 itself, cpython#128396)."""
    closures = [lambda: x for x in range(x)]  # noqa: B023 - the comprehension's cell
    return [f() for f in closures], x


def comprehension_in_generator(values: list):
    seen = [v for v in values if v]
    yield seen
    yield {v: [w for w in values if w > v] for v in values}


async def comprehension_awaiting(log: list) -> list:
    async def slow(v: int) -> int:
        await asyncio.sleep(0)
        return v

    try:
        return [await slow(v) for v in range(3)] + [await asyncio.wait_for(asyncio.sleep(1), 0)]
    except TimeoutError:
        log.append("timed out inside a comprehension")
        return [v async for v in async_gen_wrapped(log)]


def case_inlined_comprehensions():
    log: list = []
    return (
        comprehension_locals([0, 1, 2]),
        comprehension_cells(3),
        list(comprehension_in_generator([0, 1, 2])),
        asyncio.run(comprehension_awaiting(log)),
        log,
    )


def many_locals(a, b):
    """3.13 packs two locals into one instruction (LOAD_FAST_LOAD_FAST and friends) when
    both indices are below 16."""
    a, b = b, a
    c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r = range(16)  # noqa: E741
    s, t = r + a, q + b
    total = a + b + c + d + e + f + g + h + i + j + k + l + m + n + o + p + q + r + s + t
    del c
    try:
        return total + c  # noqa: F821 - unbound on purpose
    except UnboundLocalError as error:
        return total, s, t, str(error)


def case_super_instructions():
    return many_locals(1, 2), many_locals(3, 4)


def keywords(a, b=0, *args, c=1, **kwargs):
    return a, b, args, c, sorted(kwargs.items())


def case_keyword_calls():
    """3.12 sets keyword names with KW_NAMES before CALL, 3.13 calls with CALL_KW."""
    point = Point(x=1, y=2)
    out = [keywords(1, c=3), keywords(a=1, b=2, z=4), keywords(1, 2, 3, **{"c": 5, "d": 6})]
    out.append(sorted(dict(a=1, **{"b": 2}).items()))
    out.append(dataclasses.replace(point, y=5).norm1())
    try:
        keywords(1, c=2, a=3)
    except TypeError as e:
        out.append(str(e))
    return out


def frame_locals_writes():
    """PEP 667 (3.13): `frame.f_locals` is a write-through proxy of the frame's variables;
    the rewriter keeps nothing of its own there."""
    value = 1
    frame = sys._getframe()
    frame.f_locals["value"] = 2
    frame.f_locals["extra"] = "added"
    return value, sorted(frame.f_locals), "extra" in frame.f_locals


def suspended_locals():
    hidden = "before"
    yield hidden
    yield hidden


def case_frame_locals():
    gen = suspended_locals()
    next(gen)
    gen.gi_frame.f_locals["hidden"] = "written"
    return frame_locals_writes(), sorted(gen.gi_frame.f_locals), next(gen)


class Truthy:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return self.value  # a non-bool here raises TypeError where the test is


def case_conditional_jumps():
    """3.13's conditional jumps take exact bools (TO_BOOL before them); the gate does too."""
    out = []
    for value in ([], [0], "", "s", 0, 2, None, Truthy(True), Truthy(False)):
        out.append("yes" if value else "no")
        out.append(bool(value and "and") or "or")
    try:
        if Truthy("not a bool"):
            out.append("unreachable")
    except TypeError as e:
        out.append(str(e))
    return out


def case_monitoring_tool():
    """A sys.monitoring tool (3.12+) sees the same events in instrumented code: the line
    starts, starts and returns of this function's callee, nothing of the gate."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        return "no sys.monitoring"
    tool, events = 4, monitoring.events
    seen: list = []
    target = descend_safely.__code__
    monitoring.use_tool_id(tool, "torture")
    try:
        monitoring.register_callback(
            tool, events.LINE, lambda code, line: seen.append(("line", line - code.co_firstlineno))
        )
        monitoring.register_callback(
            tool, events.PY_START, lambda code, offset: seen.append(("start", code.co_name))
        )
        monitoring.set_local_events(tool, target, events.LINE | events.PY_START)
        result = descend_safely(2)
        monitoring.set_local_events(tool, target, 0)
    finally:
        monitoring.free_tool_id(tool)
    return result, seen
