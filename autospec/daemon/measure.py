"""Deprecated (one release): `python -m autospec.bench.daemon_measure` (a benchmark: bench/)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("autospec.bench.daemon_measure", run_name="__main__")
