"""The storer's line (`profiler_server/worker/storer.py`): jobs stored in order on its
thread, at most one waiting, and after a failure nothing more stored until the worker takes
back the failed job and every later one."""

from __future__ import annotations

import threading

from profiler_server.worker.storer import Storer


class Store:
    """Stores ints; fails those in `bad`; holds each job until `gate` is set."""

    def __init__(self, bad: set[int] = frozenset()) -> None:
        self.bad = bad
        self.stored: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, job: int) -> None:
        self.gate.wait(10)
        if job in self.bad:
            raise ValueError(f"cannot store {job}")
        self.stored.append(job)


def test_jobs_are_stored_in_order_on_its_thread() -> None:
    store = Store()
    storer = Storer(store)
    storer.start()
    for job in range(20):
        storer.submit(job)
    storer.wait_idle()
    assert store.stored == list(range(20))
    assert storer.returned() == []
    storer.stop(10)


def test_a_failed_job_and_every_later_one_are_given_back_unstored() -> None:
    store = Store(bad={3})
    storer = Storer(store)
    storer.start()
    for job in range(7):
        storer.submit(job)
    assert storer.returned() == [3, 4, 5, 6]
    assert store.stored == [0, 1, 2]
    storer.submit(7)  # the line stores again once the worker took them back
    storer.wait_idle()
    assert store.stored == [0, 1, 2, 7]
    storer.stop(10)


def test_submit_waits_while_a_job_waits() -> None:
    store = Store()
    store.gate.clear()
    storer = Storer(store)
    storer.start()
    storer.submit(1)
    second = threading.Thread(target=lambda: [storer.submit(2), storer.submit(3)])
    second.start()
    second.join(0.3)
    assert second.is_alive()  # 1 is being stored, 2 waits, 3 cannot be handed in yet
    store.gate.set()
    second.join(10)
    storer.wait_idle()
    assert store.stored == [1, 2, 3]
    storer.stop(10)


def test_stop_stores_what_was_handed_in() -> None:
    store = Store()
    store.gate.clear()
    storer = Storer(store)
    storer.start()
    storer.submit(1)
    storer.submit(2)
    threading.Timer(0.1, store.gate.set).start()
    storer.stop(10)
    assert store.stored == [1, 2]
    assert not storer.running
