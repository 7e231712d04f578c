"""``make test`` hands out the longest test file first (tests/scheduling.py), through xdist's own scheduler."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.scheduling import TABLE, LongestFileFirst, known_seconds


class Worker:
    """What the scheduler sees of an xdist worker: it is sent test indexes and told to shut down."""

    shutting_down = False

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


COLLECTION = ["t/test_many.py::a", "t/test_many.py::b", "t/test_many.py::c",
              "t/test_dag.py::only", "t/test_kill.py::one", "t/test_new.py::n"]


def handed_out(workers: list[Worker]) -> list[tuple[int, str]]:
    return [(w, COLLECTION[batch[0]].split("::")[0]) for w, worker in enumerate(workers) for batch in worker.sent]


class Config:
    """The options xdist's scheduler reads: ``-n 2``, and its default ordering (most tests first)."""

    option = SimpleNamespace(loadscopereorder=True)

    def getvalue(self, name: str) -> list[str]:
        assert name == "tx"
        return ["2*popen"]


def test_the_longest_file_goes_first_and_many_short_tests_last():
    sched = LongestFileFirst(Config())  # type: ignore[arg-type]
    sched.seconds = {"t/test_many.py": 3.0, "t/test_dag.py": 300.0, "t/test_kill.py": 60.0}
    sched.unknown = 10.0  # a file the table does not know
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, COLLECTION)
    sched.schedule()
    # Stock xdist hands out the file with the most tests first: test_many, then the one-test files.
    assert handed_out(workers) == [(0, "t/test_dag.py"), (0, "t/test_new.py"),
                                          (1, "t/test_kill.py"), (1, "t/test_many.py")]

    for index in workers[0].sent[0]:  # the 300 s file ends; the worker is not given more (none is left)
        sched.mark_test_complete(workers[0], index)
    assert not sched.workqueue


def test_the_last_green_full_run_overrides_the_committed_table():
    table = json.loads(TABLE.read_text())
    assert table and all(isinstance(v, (int, float)) and v >= 0 for v in table.values())
    assert all(name.startswith("tests/") and name.endswith(".py") for name in table)

    class Cache:
        def get(self, key, default):
            return {"tests/unit/test_scheduling.py": 123.0}

    seconds = known_seconds(SimpleNamespace(cache=Cache()))  # type: ignore[arg-type]
    assert seconds["tests/unit/test_scheduling.py"] == 123.0
    assert {k: v for k, v in seconds.items() if k != "tests/unit/test_scheduling.py"} == {
        k: v for k, v in table.items() if k != "tests/unit/test_scheduling.py"}
