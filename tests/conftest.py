"""Fixtures for the whole suite: the Kafka broker, and the locks that let `make test` run
its modules on two workers (pytest-xdist, ``--dist loadfile``) without one module's use of
a shared service breaking another's (tests/services.py). Run alone, the locks are free."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import KAFKA_URL, kafka_script, service_lock


def lock_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's temporary root: each xdist worker's base is a folder in it."""
    return tmp_path_factory.getbasetemp().parent


SERVICES = ("kafka", "slurm")
"""Markers of the tests that use a shared service; a module with one holds its lock."""


def module_services(items: list[pytest.Item]) -> list[str]:
    return [s for s in SERVICES if any(i.get_closest_marker(s) for i in items)]


@pytest.fixture(scope="module", autouse=True)
def _shared_services(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    items = [i for i in request.session.items if i.getparent(pytest.Module) is request.node]
    root = lock_root(tmp_path_factory)
    with contextlib.ExitStack() as stack:
        for service in module_services(items):
            stack.enter_context(service_lock(root, service))
        yield


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The broker of deploy/kafka, started if it is not running. A session fixture can be
    set up before its module's lock is taken (when the module's first test asks for it),
    so this takes the lock itself (or finds this process holding it): a worker must not
    start the broker while another's outage test has it stopped."""
    with service_lock(lock_root(tmp_path_factory), "kafka"):
        kafka_script("start.sh")
    return KAFKA_URL
