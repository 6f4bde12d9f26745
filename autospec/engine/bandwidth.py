"""Peak memory bandwidth of the device, for bandwidth utilisation (achieved / peak), and its
matrix-product throughput, for the roofline (bench/roofline.py).

CUDA: from the device's memory clock and bus width when torch exposes them. CPU: a copy
benchmark (read + write of a 256 MiB tensor, best of 5), measured once and cached per machine.
"""
from __future__ import annotations

import json
import os
import platform
import time

import torch

from autospec.paths import peak_bandwidth_file

COPY_BYTES = 256 * 2 ** 20


def peak_bandwidth_gbs(device: str = "cpu") -> float:
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        clock_khz = getattr(props, "memory_clock_rate", 0)
        bus_bits = getattr(props, "memory_bus_width", 0)
        if clock_khz and bus_bits:
            return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate
    return _cpu_copy_benchmark()


def _cpu_copy_benchmark() -> float:
    def measure() -> float:
        src = torch.ones(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
        return 2 * COPY_BYTES / best / 1e9
    return _cached("", measure)


def peak_matmul_gflops(device: str = "cpu") -> float:
    """The device's float32 matrix-product throughput, GFLOP/s: a MATMUL_SIZE^3 product, best
    of 5 after one warm-up (measured once and cached per machine, as the copy peak). What a
    forward's arithmetic is timed against (bench/roofline.py)."""
    def measure() -> float:
        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device)
        best = float("inf")
        for i in range(6):
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            torch.matmul(a, b)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            if i:  # the first is a warm-up
                best = min(best, time.perf_counter() - t0)
        return 2 * MATMUL_SIZE ** 3 / best / 1e9
    if device.startswith("cuda") and torch.cuda.is_available():
        return measure()
    return _cached("matmul|", measure)


MATMUL_SIZE = 1024


def _cached(kind: str, measure) -> float:
    """`measure()` once per machine (and torch thread count), kept in peak_bandwidth_file."""
    key = f"{kind}{platform.node()}|{platform.processor() or platform.machine()}|" \
          f"{torch.get_num_threads()}"
    path = peak_bandwidth_file()
    try:
        cached = json.loads(path.read_text())
        if key in cached:
            return float(cached[key])
    except (OSError, ValueError):
        cached = {}
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**cached, key: value}))
    except OSError:
        pass  # a read-only or full disk costs a re-measure next time, nothing else
    return value


def hardware_key(device: str = "cpu") -> str:
    """The one hardware key — serve's telemetry, the daemon's learners, the store's rows,
    tune's provenance, the report: estimates learnt on one machine type are not another's."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.machine()}:{os.cpu_count()}cpu:{torch.get_num_threads()}threads"
