"""This machine as `distro-node doctor` reports it: CPU, memory, CUDA, MLX, and a process's peak
memory. Reads ``/proc`` on Linux and falls back to the standard library elsewhere; imports torch
(it is loaded for the step measurement anyway).
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import sys
from pathlib import Path

import torch

from distronet.node.backends import ComputeBackend, mlx_import_error
from distronet.node.doctor.verdict import Machine
from distronet.node.models.fit import usable_memory

__all__ = ["PeakMemory", "describe_machine", "memory_info", "usable_bytes"]


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_info() -> tuple[int, int]:
    """(total, available) bytes of RAM: ``MemTotal``/``MemAvailable`` from ``/proc/meminfo``,
    else the physical pages (available then taken as total: unknown)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, rest = line.split(":", 1)
            fields[name] = int(rest.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return total, total


def _rss() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return _max_rss()


def _max_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes; Linux: KiB


def describe_machine(backend: ComputeBackend) -> Machine:
    """The machine the node would train on with ``backend``."""
    cuda = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cuda = (
            f"{props.name}, {props.total_memory / (1 << 30):.1f} GiB ({torch.cuda.device_count()} device(s))"
        )
    total, available = memory_info()
    return Machine(
        cpu=_cpu_name(),
        cores=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        cuda=cuda,
        mlx="installed" if mlx_import_error() is None else "not installed",
        device=backend.describe(),
        memory_total=total,
        memory_available=available,
    )


def usable_bytes(device: torch.device) -> int:
    """Memory the node may use on ``device``, comparable with a measured peak of this process:
    what the join's fit check counts as usable (``models.fit.usable_memory``: free CUDA memory,
    or RAM available now within a cgroup limit) plus what this process already holds there
    (CUDA reserved bytes, or its resident size)."""
    held = int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else _rss()
    return usable_memory(device.type).bytes + held


class PeakMemory:
    """The peak memory of what runs between :meth:`start` and :meth:`peak`: on CUDA torch's
    ``max_memory_allocated``; elsewhere the process's resident high-water mark (Linux: reset at
    ``start`` through ``/proc/self/clear_refs``; where that is refused, the process's lifetime
    peak, which can only overstate)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "CUDA allocated" if device.type == "cuda" else "process RSS"

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # "5": reset the peak RSS (VmHWM)

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return _max_rss()
