"""The NVML seam: one module imports pynvml, lazily; the fake and the real class agree."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtel.agent import nvml
from slurmtel.agent.fake_nvml import NVML_CALLS, FakeNvml
from slurmtel.agent.nvml import (
    LIBRARY_NOT_FOUND,
    UNINITIALIZED,
    Nvml,
    NvmlApi,
    NvmlError,
    cuda_version_string,
)

PACKAGE = Path(nvml.__file__).resolve().parents[1]


def seam_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(NvmlApi).items()
        if callable(member) and not name.startswith("_")
    }


def test_only_the_seam_imports_pynvml() -> None:
    importers = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(import pynvml|from pynvml)", path.read_text(), re.MULTILINE)
    ]
    assert importers == ["slurmtel/agent/nvml.py"]


def test_importing_the_agent_does_not_load_pynvml() -> None:
    code = (
        "import sys\n"
        "import slurmtel.agent.main, slurmtel.agent.sampler, slurmtel.agent.fake_nvml, slurmtel.agent.server\n"
        "print('pynvml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("implementation", [Nvml, FakeNvml])
def test_implementations_have_every_seam_method(implementation: type) -> None:
    for name, signature in seam_methods().items():
        method = getattr(implementation, name, None)
        assert method is not None, f"{implementation.__name__} lacks {name}"
        assert list(inspect.signature(method).parameters) == list(signature.parameters), name


def test_every_fake_call_names_an_nvml_function() -> None:
    device_methods = {name for name, sig in seam_methods().items() if "handle" in sig.parameters}
    assert device_methods <= set(NVML_CALLS)
    assert all(value.startswith("nvml") for value in NVML_CALLS.values())


def test_real_seam_wraps_errors() -> None:
    real = Nvml()
    with pytest.raises(NvmlError) as before_init:
        real.device_count()
    assert before_init.value.code == UNINITIALIZED
    try:
        real.init()
    except NvmlError as exc:
        # no GPU driver on this machine: NVML's own error, as an NvmlError naming the call
        assert exc.call == "nvmlInit"
        assert exc.code == LIBRARY_NOT_FOUND or exc.code in nvml.ERROR_NAMES
    else:  # a GPU machine: the seam answers
        try:
            assert real.device_count() >= 0
            assert re.fullmatch(r"\d+\.\d+", real.cuda_driver_version())
        finally:
            real.shutdown()


def test_cuda_version_string() -> None:
    assert cuda_version_string(12040) == "12.4"
    assert cuda_version_string(13010) == "13.1"
    assert cuda_version_string(11070) == "11.7"


def test_error_names() -> None:
    error = NvmlError("nvmlDeviceGetPowerUsage", 15)
    assert (error.name, str(error), error.not_supported) == (
        "GpuIsLost",
        "nvmlDeviceGetPowerUsage: GpuIsLost",
        False,
    )
    assert NvmlError("nvmlDeviceGetPowerUsage", 3).not_supported
    assert NvmlError("x", 12345).name == "Code12345"


def test_real_seam_glue_on_pynvml_structs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU the library calls cannot run; this drives Nvml's own glue (GPM two-sample
    metric, process dedup, event data, error mapping) with nvidia-ml-py's real ctypes structs,
    replacing only the functions that would enter libnvidia-ml."""
    import pynvml

    calls: list[str] = []

    def metrics_get(request: pynvml.c_nvmlGpmMetricsGet_t) -> None:
        calls.append("metrics")
        assert (request.numMetrics, request.metrics[0].metricId) == (1, pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL)
        request.metrics[0].value = 42.5

    def processes(handle: object) -> list[object]:
        info = pynvml.c_nvmlProcessInfo_v2_t(pid=5, usedGpuMemory=10, gpuInstanceId=2, computeInstanceId=0)
        return [pynvml.nvmlStructToFriendlyObject(info)]

    def wait(event_set: object, timeout: int) -> pynvml.c_nvmlEventData_t:
        data = pynvml.c_nvmlEventData_t()
        data.eventType, data.eventData = pynvml.nvmlEventTypeXidCriticalError, 79
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
        return data

    def lost() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    for name, func in {
        "nvmlDeviceIsMigDeviceHandle": lambda h: False,
        "nvmlGpmSampleAlloc": lambda: pynvml.c_nvmlGpmSample_t(),
        "nvmlGpmSampleGet": lambda h, sample: sample,
        "nvmlGpmSampleFree": lambda sample: calls.append("free"),
        "nvmlGpmMetricsGet": metrics_get,
        "nvmlDeviceGetComputeRunningProcesses": processes,
        "nvmlDeviceGetGraphicsRunningProcesses": processes,
        "nvmlEventSetWait_v2": wait,
        "nvmlDeviceGetUUID": lambda h: "GPU-x",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 12040,
        "nvmlDeviceGetCount": lost,
    }.items():
        monkeypatch.setattr(pynvml, name, func)
    monkeypatch.delattr(pynvml, "nvmlGpmQueryDeviceSupport")
    real = Nvml()
    real._nv = pynvml
    handle = pynvml.c_nvmlDevice_t()
    assert real.gr_engine_active_percent(handle) is None  # first GPM sample
    assert real.gr_engine_active_percent(handle) == 42.5
    assert calls == ["metrics", "free"]
    assert real.running_processes(handle) == [nvml.GpuProcess(5, 10, 2, 0)]
    assert real.event_wait(object(), 10) == nvml.NvmlEvent("GPU-x", nvml.EVENT_XID_CRITICAL, 79)
    assert real.cuda_driver_version() == "12.4"
    with pytest.raises(NvmlError) as lost_error:
        real.device_count()
    assert (lost_error.value.call, lost_error.value.name) == ("nvmlDeviceGetCount", "GpuIsLost")
    with pytest.raises(NvmlError) as missing:
        real.supports_gr_engine_active(handle)
    assert missing.value.not_supported
