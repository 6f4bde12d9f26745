"""Peak memory bandwidth of the device, for bandwidth utilisation (achieved / peak), and its
matrix-product throughput, for the roofline (bench/roofline.py).

CUDA: from the device's memory clock and bus width when torch exposes them. CPU: a copy
benchmark (read + write of a 256 MiB tensor, best of 5), cached per machine. Background load
can only lower such a measurement, so the cache keeps the highest one seen and the recent
ones beside it (their spread): every `autospec bench` measures again before it runs
(`remeasure=True`), so a peak first measured under load is replaced by the next quiet one, and
a bench's JSON says which peak it used, when that was measured, and what this run measured.
"""
from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone

import torch

from autospec.paths import peak_bandwidth_file

COPY_BYTES = 256 * 2 ** 20


KEPT = 8  # recent measurements kept per key, for their spread


def peak_bandwidth_gbs(device: str = "cpu", remeasure: bool = False) -> float:
    return peak_bandwidth(device, remeasure)["gbs"]


def peak_bandwidth(device: str = "cpu", remeasure: bool = False) -> dict:
    """{"gbs": the peak in use, "source", and for a measured one "measured_at" (when that peak
    was measured, UTC), "recent" (the last measurements, GB/s), "spread" ((max - min) / max of
    those), "this_run" (what `remeasure` measured now, else absent)}."""
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        clock_khz = getattr(props, "memory_clock_rate", 0)
        bus_bits = getattr(props, "memory_bus_width", 0)
        if clock_khz and bus_bits:  # double data rate
            return {"gbs": 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "source": "cuda spec"}
    return _cpu_copy_benchmark(remeasure)


def _cpu_copy_benchmark(remeasure: bool) -> dict:
    def measure() -> float:
        src = torch.ones(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
        return 2 * COPY_BYTES / best / 1e9
    return _cached("", measure, remeasure)


def peak_matmul_gflops(device: str = "cpu", remeasure: bool = False) -> float:
    """The device's float32 matrix-product throughput, GFLOP/s: a MATMUL_SIZE^3 product, best
    of 5 after one warm-up (cached per machine, the highest kept, as the copy peak). What a
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
    return _cached("matmul|", measure, remeasure)["gbs"]


MATMUL_SIZE = 1024


def _cached(kind: str, measure, remeasure: bool = False) -> dict:
    """`measure()` per machine (and torch thread count), kept in peak_bandwidth_file: the
    highest measurement seen is the peak (load only lowers one), with the recent ones.
    Measured when nothing is cached or `remeasure`. (The value is in "gbs" whatever it
    measures.)"""
    key = f"{kind}{platform.node()}|{platform.processor() or platform.machine()}|" \
          f"{torch.get_num_threads()}"
    path = peak_bandwidth_file()
    try:
        cached = json.loads(path.read_text())
        if not isinstance(cached, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        cached = {}
    # entries under "v2|KEY"; a bare KEY holds one float, as versions before kept it (and
    # still read it: they must not meet a dict there)
    entry = cached.get(f"v2|{key}")
    if entry is None and isinstance(cached.get(key), (int, float)):
        entry = {"gbs": float(cached[key]), "measured_at": None, "recent": [float(cached[key])]}
    if entry is not None and not remeasure:
        return {**entry, "source": "cache", "spread": _spread(entry["recent"])}
    now = measure()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    recent = ((entry or {}).get("recent", []) + [now])[-KEPT:]
    if entry is None or now > entry["gbs"]:
        entry = {"gbs": now, "measured_at": stamp, "recent": recent}
    else:
        entry = {**entry, "recent": recent}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**cached, key: entry["gbs"], f"v2|{key}": entry}))
    except OSError:
        pass  # a read-only or full disk costs a re-measure next time, nothing else
    return {**entry, "source": "measured", "spread": _spread(recent), "this_run": now}


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / max(values) if values else 0.0


def hardware_key(device: str = "cpu") -> str:
    """The one hardware key — serve's telemetry, the daemon's learners, the store's rows,
    tune's provenance, the report: estimates learnt on one machine type are not another's."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.machine()}:{os.cpu_count()}cpu:{torch.get_num_threads()}threads"
