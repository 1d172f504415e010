"""The fake pynvml and the backend against the REAL installed pynvml (nvidia-ml-py).

No GPU is needed: these compare names, parameter names, constant values, error classes
and struct layouts, so a test written against the fake holds against the real module.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import inspect
import sys
import time
from pathlib import Path

import pytest

from fleetcare.collectors.backend import BackendError
from fleetcare.collectors.nvml import NVML_CONSTANTS, NVML_FUNCTIONS, NvmlBackend

real = pytest.importorskip("pynvml")

STRUCTS = (
    "nvmlPciInfo_t",
    "c_nvmlMemory_t",
    "c_nvmlUtilization_t",
    "c_nvmlValue_t",
    "c_nvmlFieldValue_t",
    "c_nvmlEventData_t",
)


@pytest.fixture(scope="module")
def fake():
    name = "fake_pynvml_real_api"
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fake_pynvml.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_backend_functions_exist_with_the_real_parameters(fake, name):
    assert hasattr(real, name), f"pynvml has no {name}"
    assert _params(getattr(fake, name)) == _params(getattr(real, name))


def test_every_function_the_fake_defines_matches_the_real_one(fake):
    names = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    names = [n for n in names if inspect.isfunction(getattr(fake, n))]
    assert set(NVML_FUNCTIONS) <= set(names)
    for name in names:
        assert _params(getattr(fake, name)) == _params(getattr(real, name)), name


def test_a_full_backend_run_calls_only_listed_functions(fake):
    fake.install(fake.Scenario(gpus=[fake.FakeGpu(uuid="GPU-aaaa")]))
    fake.scenario.has_event_reasons = False  # and the batched fields fail: every fallback runs
    gpu = fake.scenario.gpus[0]
    for fid in (fake.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, fake.NVML_FI_DEV_PCIE_REPLAY_COUNTER):
        gpu.errors[f"field:{fid}"] = fake.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend("n", nvml=fake, event_timeout_ms=5)
    fake.queue_xid(0, 79)
    deadline = time.monotonic() + 2
    while not fake.scenario.events.empty() and time.monotonic() < deadline:
        time.sleep(0.005)
    backend.poll(dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    backend.close()
    assert {name for name, _ in fake.calls} == set(NVML_FUNCTIONS)


@pytest.mark.parametrize("name", NVML_CONSTANTS)
def test_backend_constants_have_the_real_values(fake, name):
    assert getattr(fake, name) == getattr(real, name)


def test_every_constant_of_the_fake_has_the_real_value(fake):
    names = [n for n in dir(fake) if n.startswith(("NVML_", "nvmlEventType", "nvmlClocks"))]
    assert len(names) > 60
    for name in names:
        assert getattr(fake, name) == getattr(real, name), name


def test_error_classes_map_to_the_same_codes(fake):
    fake_errors = {n for n in dir(fake) if n.startswith("NVMLError_")}
    real_errors = {n for n in dir(real) if n.startswith("NVMLError_")}
    assert fake_errors == real_errors
    for name in fake_errors:
        code = getattr(real, name)(0).value  # the subclass fixes its own code
        assert getattr(fake, name)(0).value == code, name
        assert type(fake.NVMLError(code)).__name__ == type(real.NVMLError(code)).__name__
        assert issubclass(getattr(fake, name), fake.NVMLError)
    assert sorted(fake.NVMLError._valClassMapping) == sorted(real.NVMLError._valClassMapping)


@pytest.mark.parametrize("name", STRUCTS)
def test_structs_have_the_real_fields(fake, name):
    def fields(cls):
        return [f[0] for f in cls._fields_]

    assert fields(getattr(fake, name)) == fields(getattr(real, name))


def test_real_module_without_a_driver_gives_a_clear_backend_error():
    try:
        real.nvmlInit()
    except real.NVMLError:
        pass
    else:  # a machine with a driver: nothing to check here
        real.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    with pytest.raises(BackendError, match="is the NVIDIA driver loaded"):
        NvmlBackend("n", nvml=real)
