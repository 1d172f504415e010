"""The locks that let `make test` run on two workers (tests/conftest.py): a module holds
the lock of every shared service its tests are marked with, and while it does no other
process gets that lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import module_services
from tests.services import service_lock

TRY_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a+b") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)
"""


def other_process_gets(lock_file: Path) -> bool:
    rc = subprocess.run([sys.executable, "-c", TRY_LOCK, str(lock_file)], timeout=30).returncode
    assert rc in (0, 3), rc
    return rc == 0


def test_a_held_service_lock_excludes_other_processes(tmp_path: Path) -> None:
    with service_lock(tmp_path, "kafka"):
        assert not other_process_gets(tmp_path / "fleetcare-kafka.lock")
        assert other_process_gets(tmp_path / "fleetcare-slurm.lock")
    assert other_process_gets(tmp_path / "fleetcare-kafka.lock")


def test_the_lock_is_taken_again_by_the_process_that_holds_it(tmp_path: Path) -> None:
    """Was: a module holding the Kafka lock whose test first asked for the session
    fixture kafka_broker (which takes it too) waited for itself, and `make test` hung."""
    code = ("import sys; from pathlib import Path; from tests.services import service_lock\n"
            "root = Path(sys.argv[1])\n"
            "with service_lock(root, 'kafka'):\n"
            "    with service_lock(root, 'kafka'):\n"
            "        pass\n"
            "    print('still held')\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=30, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout == "still held\n", out.stderr
    with service_lock(tmp_path, "kafka"):
        with service_lock(tmp_path, "kafka"):
            pass
        assert not other_process_gets(tmp_path / "fleetcare-kafka.lock")  # still held
    assert other_process_gets(tmp_path / "fleetcare-kafka.lock")


def test_a_module_locks_the_services_its_tests_are_marked_with(
        request: pytest.FixtureRequest) -> None:
    class Item:
        def __init__(self, *marks: str) -> None:
            self.marks = marks

        def get_closest_marker(self, name: str) -> object:
            return name if name in self.marks else None

    assert module_services([Item(), Item("slow", "kafka")]) == ["kafka"]  # type: ignore[list-item]
    assert module_services([Item("slurm"), Item("kafka")]) == ["kafka", "slurm"]  # type: ignore[list-item]
    assert module_services([Item("prometheus")]) == []  # type: ignore[list-item]
    # (in a whole run) every test of this suite that uses the broker is marked so
    unmarked = [i.nodeid for i in request.session.items
                if "kafka_broker" in getattr(i, "fixturenames", ())
                and not i.get_closest_marker("kafka")]
    assert unmarked == []
