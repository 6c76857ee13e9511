"""The hardware monitor: RSS against /proc, GPU readings None and said so without NVML, NVML failures handled,
a stand-in pynvml for the GPU readings and the CUDA_VISIBLE_DEVICES mapping, and no CUDA sync."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch

from amp_inspect.runlog import hardware
from amp_inspect.runlog.hardware import KEYS, HardwareMonitor, NvmlSession, visible_devices

GPU_KEYS = ("gpu_mem_used", "gpu_mem_total", "gpu_util", "gpu_temp")
TORCH_KEYS = ("torch_allocated", "torch_reserved", "torch_peak")
GIB = 1 << 30


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch):
    """Each test starts without a cached NVML session, monitors or notes, and with CUDA_VISIBLE_DEVICES unset."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hardware.reset()
    yield
    hardware.reset()


def fake_nvml(count: int = 4, *, init_error: int | None = None, unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    """A stand-in pynvml: GPU i has UUID GPU-<i repeated>..., i+1 GiB used of 80, utilisation 10*i %, 40+i C.
    ``calls`` counts each query; queries named in ``unsupported`` fail with NVML_ERROR_NOT_SUPPORTED."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_ERROR_NOT_SUPPORTED = 3
    nvml.NVML_ERROR_DRIVER_NOT_LOADED = 9
    nvml.NVML_ERROR_NOT_FOUND = 6
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.calls = {}

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return {3: "Not Supported", 9: "Driver Not Loaded", 6: "Not Found"}[self.value]

    nvml.NVMLError = NVMLError
    uuids = [f"GPU-{str(i) * 8}-1111-2222-3333-444444444444" for i in range(count)]

    def counted(name: str, fn):
        def call(*args):
            nvml.calls[name] = nvml.calls.get(name, 0) + 1
            if name in unsupported:
                raise NVMLError(3)
            return fn(*args)

        return call

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    def by_index(i: int):
        if not 0 <= i < count:
            raise NVMLError(6)
        return ("handle", i)

    def by_uuid(uuid: str):
        if uuid not in uuids:
            raise NVMLError(6)
        return ("handle", uuids.index(uuid))

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = by_index
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetUUID = lambda h: uuids[h[1]].encode()  # older nvidia-ml-py returned bytes
    nvml.nvmlDeviceGetMemoryInfo = counted(
        "memory", lambda h: types.SimpleNamespace(used=(h[1] + 1) * GIB, total=80 * GIB, free=0)
    )
    nvml.nvmlDeviceGetUtilizationRates = counted("util", lambda h: types.SimpleNamespace(gpu=10 * h[1], memory=0))
    nvml.nvmlDeviceGetTemperature = counted("temp", lambda h, sensor: 40 + h[1])
    return nvml


def gpu_of(reading: dict) -> int:
    """Which fake GPU a reading came from (its temperature is 40 + index)."""
    return reading["gpu_temp"] - 40


def vm_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


# ---- this machine ----


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_rss_matches_proc_status() -> None:
    reading = hardware.sample()
    expected = vm_rss_bytes()
    assert isinstance(reading["rss_bytes"], int) and reading["rss_bytes"] > 0
    assert abs(reading["rss_bytes"] - expected) <= max(0.05 * expected, 16 << 20)


def test_sample_has_every_key_and_no_gpu_readings_on_cpu() -> None:
    for device in (None, "cpu", torch.device("cpu")):
        reading = hardware.sample(device)
        assert tuple(reading) == KEYS
        assert all(reading[k] is None for k in GPU_KEYS + TORCH_KEYS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_gpu_here_is_said_plainly() -> None:
    reading = hardware.sample("cuda:0")
    assert all(reading[k] is None for k in GPU_KEYS + TORCH_KEYS)
    message = hardware.note()
    assert message is not None and message.startswith("GPU metrics not available: ")
    assert "NVML could not be initialised" in message or "no GPU visible" in message
    assert hardware.note() is message  # cached


def test_nvml_init_failure_is_handled(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def refuse() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", refuse)
    reading = hardware.sample("cuda:0")
    assert all(reading[k] is None for k in GPU_KEYS)
    assert hardware.note("cuda:0") == "GPU metrics not available: NVML could not be initialised (Driver Not Loaded)."


def test_missing_nvidia_ml_py_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert hardware.sample("cuda:0")["gpu_temp"] is None
    assert "nvidia-ml-py is not installed" in hardware.note()


def test_sampling_never_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA made to look initialised and a fake NVML, a sample fills every key without synchronising."""

    def forbidden(*args: object) -> None:
        raise AssertionError("sample() synchronised the device")

    stats = {
        "allocated_bytes": {"all": {"current": 3 * GIB, "peak": 5 * GIB}},
        "reserved_bytes": {"all": {"current": 4 * GIB}},
    }
    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", forbidden, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: stats)
    monkeypatch.setattr(hardware, "_torch_uuid", lambda index: None)
    monitor = HardwareMonitor("cuda:2", nvml=NvmlSession(fake_nvml()))
    for _ in range(100):
        reading = monitor.sample()
    assert reading["torch_allocated"] == 3 * GIB
    assert reading["torch_reserved"] == 4 * GIB
    assert reading["torch_peak"] == 5 * GIB
    assert (reading["gpu_mem_used"], reading["gpu_mem_total"]) == (3 * GIB, 80 * GIB)
    assert (reading["gpu_util"], reading["gpu_temp"]) == (20, 42)
    assert all(isinstance(reading[k], int) for k in KEYS)


# ---- a stand-in NVML ----


def test_fake_nvml_fills_gpu_readings() -> None:
    nvml = fake_nvml()
    monitor = HardwareMonitor("cuda:1", nvml=NvmlSession(nvml))
    reading = monitor.sample()
    assert reading["gpu_mem_used"] == 2 * GIB and reading["gpu_mem_total"] == 80 * GIB
    assert reading["gpu_util"] == 10 and reading["gpu_temp"] == 41
    assert reading["torch_allocated"] is None  # CUDA is not initialised here: torch's allocator is not asked
    assert monitor.note() is None


@pytest.mark.parametrize(
    ("visible", "torch_index", "nvml_index"),
    [
        (None, 2, 2),
        ("2,0", 0, 2),
        ("2,0", 1, 0),
        (" 3 , 1", 1, 1),
        ("GPU-33333333-1111-2222-3333-444444444444,GPU-00000000-1111-2222-3333-444444444444", 0, 3),
        ("GPU-1111,GPU-2222", 1, 2),  # UUID prefixes, as CUDA accepts them
    ],
)
def test_cuda_visible_devices_mapping(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, torch_index: int, nvml_index: int
) -> None:
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    reading = HardwareMonitor(f"cuda:{torch_index}", nvml=NvmlSession(fake_nvml())).sample()
    assert gpu_of(reading) == nvml_index


def test_torch_uuid_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once CUDA is initialised, the UUID torch reports names the GPU (CUDA_DEVICE_ORDER can reorder ordinals)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(hardware, "_torch_uuid", lambda index: "11111111-1111-2222-3333-444444444444")
    reading = HardwareMonitor("cuda:0", nvml=NvmlSession(fake_nvml())).sample()
    assert gpu_of(reading) == 1


@pytest.mark.parametrize(("visible", "why"), [("", "no GPU visible"), ("-1", "no GPU visible"), ("7", "names GPU 7")])
def test_hidden_or_missing_gpu_is_said(monkeypatch: pytest.MonkeyPatch, visible: str, why: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monitor = HardwareMonitor("cuda:0", nvml=NvmlSession(fake_nvml()))
    assert all(monitor.sample()[k] is None for k in GPU_KEYS)
    assert why in monitor.note()


def test_no_gpu_from_nvml_is_said() -> None:
    monitor = HardwareMonitor("cuda:0", nvml=NvmlSession(fake_nvml(count=0)))
    assert monitor.sample()["gpu_temp"] is None
    assert monitor.note() == "GPU metrics not available: no GPU visible."


def test_fake_nvml_init_failure() -> None:
    monitor = HardwareMonitor("cuda:0", nvml=NvmlSession(fake_nvml(init_error=9)))
    assert monitor.sample()["gpu_mem_used"] is None
    assert monitor.note() == "GPU metrics not available: NVML could not be initialised (Driver Not Loaded)."


def test_unsupported_query_is_not_repeated() -> None:
    """MIG instances and some boards do not report utilisation: None, and NVML is not asked again."""
    nvml = fake_nvml(unsupported=("util",))
    monitor = HardwareMonitor("cuda:0", nvml=NvmlSession(nvml))
    for _ in range(5):
        reading = monitor.sample()
    assert reading["gpu_util"] is None and reading["gpu_temp"] == 40
    assert nvml.calls == {"util": 1, "memory": 5, "temp": 5}


def test_module_sample_uses_the_process_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert gpu_of(hardware.sample("cuda:0")) == 3
    assert hardware.note("cuda:0") is None
    assert hardware.monitor("cuda:0") is hardware.monitor(torch.device("cuda", 0))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("1,0", [1, 0]),
        ("0,2,-1,3", [0, 2]),  # CUDA stops at the first invalid entry
        ("0,0", []),  # a repeated entry hides every GPU
        ("GPU-ab,MIG-cd,3", ["GPU-ab", "MIG-cd"]),
    ],
)
def test_visible_devices_parsing(value: str | None, expected: list | None) -> None:
    assert visible_devices(value) == expected


# ---- a real GPU (skipped without one) ----


@pytest.mark.cuda
def test_real_gpu_sample_without_sync() -> None:
    """On a GPU: torch's allocator readings see a 64 MiB tensor, NVML's GPU is torch's (same UUID), and a sample
    taken while a kernel still runs leaves it running (the sample did not wait for the device)."""
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the current stream
    reading = hardware.sample(block.device)
    still_running = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_running, "sample() waited for the GPU"
    assert reading["torch_allocated"] >= 64 << 20
    assert reading["torch_peak"] >= reading["torch_allocated"]
    assert reading["torch_reserved"] >= reading["torch_allocated"]
    if hardware.note(block.device) is not None:
        pytest.skip(f"NVML not usable in this environment: {hardware.note(block.device)}")
    props = torch.cuda.get_device_properties(block.device)
    assert abs(reading["gpu_mem_total"] - props.total_memory) <= 0.1 * props.total_memory
    assert 0 < reading["gpu_mem_used"] <= reading["gpu_mem_total"]
    assert reading["gpu_util"] is None or 0 <= reading["gpu_util"] <= 100
    assert reading["gpu_temp"] is None or 0 < reading["gpu_temp"] < 130
    monitor = hardware.monitor(block.device)
    handle = monitor._handle(block.device.index or 0)
    nvml_uuid = monitor.nvml.module.nvmlDeviceGetUUID(handle)
    assert hardware._bare_uuid(nvml_uuid) == hardware._bare_uuid(str(props.uuid))
