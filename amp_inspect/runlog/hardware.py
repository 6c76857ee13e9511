"""Hardware readings taken once per inspected step: process memory, torch's CUDA allocator and the GPU itself.

Terms, defined once here:

- ``rss_bytes``: the process's **resident set size**, the bytes of its memory in RAM now (``/proc/self/statm``).
  Where /proc is missing it is the *peak* resident set size from ``getrusage`` instead, and ``note()`` says so.
- ``torch_allocated``: bytes held by live CUDA tensors; ``torch_reserved``: bytes torch's caching allocator
  holds from the driver (allocated plus cached free blocks); ``torch_peak``: the largest ``torch_allocated``
  since the start (or the last ``torch.cuda.reset_peak_memory_stats``). None for a CPU device.
- ``gpu_mem_used`` / ``gpu_mem_total``: bytes in use / in all on the whole GPU as NVML sees them, every process
  and the CUDA context included; ``gpu_util``: percent of NVML's last sample period (1/6 s to 1 s) in which a
  kernel ran; ``gpu_temp``: the GPU's temperature in degrees Celsius. None where NVML cannot tell.

Cost of one ``sample``: no CUDA synchronisation and no CUDA initialisation. One read of /proc/self/statm (a few
microseconds), torch's allocator statistics (host-side bookkeeping) and three NVML queries (host-side driver
calls, tens of microseconds each). NVML (the ``pynvml`` module of the nvidia-ml-py package) is initialised once,
on the first sample that needs it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

import torch

KEYS = (
    "rss_bytes",
    "torch_allocated",
    "torch_reserved",
    "torch_peak",
    "gpu_mem_used",
    "gpu_mem_total",
    "gpu_util",
    "gpu_temp",
)
Sample = dict[str, float | int | None]

_STATM = "/proc/self/statm"
_UUID_PREFIXES = ("GPU-", "MIG-")


# ---- process memory ----


def _rss_source() -> str | None:
    """Where rss_bytes comes from: "statm" (current RSS), "getrusage" (peak RSS) or None."""
    if os.path.exists(_STATM):
        return "statm"
    try:
        import resource  # noqa: F401  (Unix only)
    except ImportError:
        return None
    return "getrusage"


_RSS_SOURCE = _rss_source()
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """The process's resident set size in bytes (peak RSS where /proc is missing; None where neither works).

    Opens /proc/self/statm on each call (a cached descriptor would keep reading the parent after a fork)."""
    if _RSS_SOURCE == "statm":
        try:
            with open(_STATM, "rb") as f:
                return int(f.read().split()[1]) * _PAGE_SIZE
        except (OSError, ValueError, IndexError):
            return None
    if _RSS_SOURCE == "getrusage":
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere
    return None


# ---- CUDA_VISIBLE_DEVICES ----


def visible_devices(value: str | None) -> list[int] | list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU visible), else the ordinals or UUIDs
    (whole, or prefixes of them) it lists, in order, up to the first entry CUDA rejects. An empty list means no
    GPU is visible ("", "-1", or a repeated entry)."""
    if value is None:
        return None
    entries = [entry.strip() for entry in value.split(",")]
    if entries[0].startswith(_UUID_PREFIXES):
        uuids: list[str] = []
        for entry in entries:
            if not entry.startswith(_UUID_PREFIXES):
                break
            if entry in uuids:
                return []
            uuids.append(entry)
        return uuids
    ordinals: list[int] = []
    for entry in entries:
        if not entry.isdigit():
            break
        if int(entry) in ordinals:
            return []
        ordinals.append(int(entry))
    return ordinals


def _bare_uuid(uuid: str | bytes) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    for prefix in _UUID_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :].lower()
    return text.lower()


def _torch_uuid(index: int) -> str | None:
    """The UUID CUDA gives torch's device ``index``, only when CUDA is already initialised (never initialises
    it). It names the GPU whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say."""
    if not torch.cuda.is_initialized():
        return None
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except (RuntimeError, AssertionError):
        return None
    return None if uuid is None else str(uuid)


# ---- NVML ----


class NvmlSession:
    """NVML, initialised once on first use. ``module`` is the pynvml module (nvidia-ml-py) or None, and
    ``error`` says why NVML is unusable (None when it works). Pass a stand-in module for tests."""

    def __init__(self, module: Any = None) -> None:
        self._given = module
        self._lock = threading.Lock()
        self._started = False
        self.module: Any = None
        self.error: str | None = None
        self.device_count = 0

    def start(self) -> bool:
        """Initialises NVML on the first call (tens of milliseconds; no CUDA call). True when it works."""
        if self._started:
            return self.error is None
        with self._lock:
            if not self._started:
                self._init()
                self._started = True
        return self.error is None

    def _init(self) -> None:
        nvml = self._given
        if nvml is None:
            try:
                import pynvml as nvml  # the nvidia-ml-py package (not the deprecated "pynvml" distribution)
            except ImportError:
                self.error = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
                return
        try:
            nvml.nvmlInit()
            self.device_count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as error:
            self.error = f"NVML could not be initialised ({error})"
            return
        except OSError as error:  # a broken driver library can fail to load before NVML answers
            self.error = f"NVML could not be initialised ({error})"
            return
        self.module = nvml

    def shutdown(self) -> None:
        """Releases NVML if this session initialised it; a later ``start`` initialises it again."""
        with self._lock:
            if self.module is not None:
                with contextlib.suppress(self.module.NVMLError):
                    self.module.nvmlShutdown()
            self.module, self.error, self.device_count, self._started = None, None, 0, False

    def uuids(self) -> list[str]:
        """The UUIDs of every GPU NVML sees, in NVML's order (one driver query each)."""
        nvml = self.module
        return [_decode(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(self.device_count)]

    def handle(self, index: int) -> Any:
        """The NVML handle of torch's CUDA device ``index``.

        Matched by the UUID CUDA reports when torch has initialised CUDA; otherwise through CUDA_VISIBLE_DEVICES
        (ordinals or UUID prefixes), and by index when it is unset. LookupError when no GPU matches."""
        nvml = self.module
        uuid = _torch_uuid(index)
        if uuid is not None:
            for i, candidate in enumerate(self.uuids()):
                if _bare_uuid(candidate) == _bare_uuid(uuid):
                    return nvml.nvmlDeviceGetHandleByIndex(i)
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = visible_devices(env)
        if visible is None:
            if index >= self.device_count:
                raise LookupError(f"NVML sees {self.device_count} GPUs, none with index {index}")
            return nvml.nvmlDeviceGetHandleByIndex(index)
        if index >= len(visible):
            raise LookupError(f"CUDA_VISIBLE_DEVICES={env!r} makes no GPU cuda:{index}")
        entry = visible[index]
        if isinstance(entry, int):
            if entry >= self.device_count:
                raise LookupError(f"CUDA_VISIBLE_DEVICES={env!r} names GPU {entry}; NVML sees {self.device_count}")
            return nvml.nvmlDeviceGetHandleByIndex(entry)
        with contextlib.suppress(nvml.NVMLError):
            return nvml.nvmlDeviceGetHandleByUUID(entry)  # a whole UUID, MIG instances included
        matches = [i for i, u in enumerate(self.uuids()) if _bare_uuid(u).startswith(_bare_uuid(entry))]
        if len(matches) != 1:
            found = "matches no GPU" if not matches else f"matches {len(matches)} GPUs"
            raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry!r} {found}")
        return nvml.nvmlDeviceGetHandleByIndex(matches[0])


def _decode(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_session_lock = threading.Lock()
_session: NvmlSession | None = None
_monitors: dict[str, HardwareMonitor] = {}
_note_cache: dict[str, str | None] = {}


def nvml_session() -> NvmlSession:
    """The process's NVML session (created on first call; NVML itself starts on the first GPU sample)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = NvmlSession()
        return _session


def reset() -> None:
    """Forgets NVML's state and the cached monitors (after a fork, or in tests); the next sample starts over."""
    global _session
    with _session_lock:
        if _session is not None:
            _session.shutdown()
        _session = None
        _monitors.clear()
        _note_cache.clear()


# ---- the monitor ----


def _as_device(device: torch.device | str | int | None) -> torch.device | None:
    if device is None:
        return None
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


class HardwareMonitor:
    """Samples the readings of the module docstring for one device; holds its NVML handle.

    ``device``: the training device; None means torch's current CUDA device when CUDA is initialised, else the
    CPU (GPU readings None). A monitor never initialises CUDA.
    """

    def __init__(self, device: torch.device | str | int | None = None, *, nvml: NvmlSession | None = None) -> None:
        self.device = _as_device(device)
        self._nvml = nvml
        self._handles: dict[int, Any] = {}
        self._handle_errors: dict[int, str] = {}
        self._unsupported: set[tuple[int, str]] = set()  # (GPU index, query) that NVML said it does not support

    @property
    def nvml(self) -> NvmlSession:
        return self._nvml if self._nvml is not None else nvml_session()

    def _cuda_index(self) -> int | None:
        """torch's index of the CUDA device to sample, or None for a CPU device (or no CUDA in use yet)."""
        device = self.device
        if device is None:
            return torch.cuda.current_device() if torch.cuda.is_initialized() else None
        if device.type != "cuda":
            return None
        if device.index is not None:
            return device.index
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0

    def sample(self) -> Sample:
        """One reading of every key in KEYS (None where unavailable). No CUDA sync; see the module docstring."""
        out: Sample = dict.fromkeys(KEYS)
        out["rss_bytes"] = rss_bytes()
        index = self._cuda_index()
        if index is None:
            return out
        if torch.cuda.is_initialized():
            # Allocator bookkeeping on the host; the nested dict skips memory_stats' flattening.
            stats = torch.cuda.memory.memory_stats_as_nested_dict(index)
            allocated, reserved = stats.get("allocated_bytes", {}), stats.get("reserved_bytes", {})
            out["torch_allocated"] = allocated.get("all", {}).get("current")
            out["torch_reserved"] = reserved.get("all", {}).get("current")
            out["torch_peak"] = allocated.get("all", {}).get("peak")
        handle = self._handle(index)
        if handle is not None:
            self._sample_gpu(index, handle, out)
        return out

    def _handle(self, index: int) -> Any:
        if index in self._handles:
            return self._handles[index]
        session = self.nvml
        handle = None
        if session.start():
            try:
                handle = session.handle(index)
            except (LookupError, session.module.NVMLError) as error:
                self._handle_errors[index] = str(error)
        self._handles[index] = handle
        return handle

    def _query(self, index: int, name: str, call: Any) -> Any:
        """One NVML query; None on failure, and never asked again where NVML says it is not supported."""
        if (index, name) in self._unsupported:
            return None
        nvml = self.nvml.module
        try:
            return call()
        except nvml.NVMLError as error:
            if getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                self._unsupported.add((index, name))
            return None

    def _sample_gpu(self, index: int, handle: Any, out: Sample) -> None:
        nvml = self.nvml.module
        memory = self._query(index, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            out["gpu_mem_used"] = int(memory.used)
            out["gpu_mem_total"] = int(memory.total)
        util = self._query(index, "util", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            out["gpu_util"] = int(util.gpu)
        temp = self._query(index, "temp", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        if temp is not None:
            out["gpu_temp"] = int(temp)

    def note(self) -> str | None:
        """Why GPU readings are missing for this monitor's device, as plain sentences; None when nothing is.

        Starts NVML if no sample has yet (once per process); otherwise costs nothing."""
        sentences = []
        general = _gpu_note(self.nvml)
        index = self._cuda_index()
        if general is not None:
            sentences.append(general)
        elif self.device is not None and self.device.type != "cuda":
            sentences.append(f"GPU metrics not sampled: the device is {self.device}, not a GPU.")
        elif index is not None:
            self._handle(index)
            if index in self._handle_errors:
                sentences.append(f"GPU metrics not available for cuda:{index}: {self._handle_errors[index]}.")
        rss = _rss_note()
        if rss is not None:
            sentences.append(rss)
        return " ".join(sentences) or None


def _gpu_note(session: NvmlSession) -> str | None:
    session.start()
    if session.error is not None:
        return f"GPU metrics not available: {session.error}."
    if visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")) == []:
        return "GPU metrics not available: no GPU visible (CUDA_VISIBLE_DEVICES hides them all)."
    if session.device_count == 0:
        return "GPU metrics not available: no GPU visible."
    return None


def _rss_note() -> str | None:
    if _RSS_SOURCE == "getrusage":
        return "rss_bytes is the peak resident set size (getrusage): /proc/self/statm is not available."
    if _RSS_SOURCE is None:
        return "rss_bytes not available: neither /proc/self/statm nor getrusage exists here."
    return None


def monitor(device: torch.device | str | int | None = None) -> HardwareMonitor:
    """The cached HardwareMonitor of ``device`` (one per device for the process)."""
    key = str(_as_device(device))
    found = _monitors.get(key)
    if found is None:
        found = _monitors.setdefault(key, HardwareMonitor(device))
    return found


def sample(device: torch.device | str | int | None = None) -> Sample:
    """The readings of KEYS for ``device`` (see the module docstring): no CUDA sync, no CUDA initialisation.

    ``device`` None: torch's current CUDA device when CUDA is initialised, else the CPU (GPU readings None)."""
    return monitor(device).sample()


def note(device: torch.device | str | int | None = None) -> str | None:
    """A plain sentence saying why GPU metrics are not available (NVML could not start, no GPU visible, ...), or
    None when they are. Computed once per device and cached (``reset()`` clears it with NVML's state)."""
    key = str(_as_device(device))
    if key not in _note_cache:
        _note_cache[key] = monitor(device).note()
    return _note_cache[key]
