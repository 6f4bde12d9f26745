"""A machine with a GPU, checked in one prepared run: `python -m autospec.kernels.device_check`.

1. The kernel tests with Triton compiled on the device (`pytest tests/kernels`, from a
   checkout: skipped where the tests are not beside the package).
2. greedy_verify's Triton kernel against its torch reference over the tiling space
   (BLOCK_V x num_warps x num_stages) at verify shapes (rows x drafted x vocabulary: one row
   and 16, SmolLM2's 49k words and the reference pair's 4k): microseconds, the fastest tiling,
   and that every tiling gives the reference's result.
3. Plain decoding against the memory roofline: one forward of one token a row of the shipped
   reference pair's target (and SmolLM2's where it is fetched) over the engine's RowCache, at
   1 and 16 rows, its weights + KV read ÷ seconds, ÷ the device's peak (CUDA: memory clock x
   bus width; CPU: the measured copy peak, engine/bandwidth.py).

Without a CUDA device it says so, times the reference kernel only (Triton's interpreter is not
worth timing) and runs 3 on the CPU — what the suite checks. Nothing here is needed to serve.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

TILINGS = {"BLOCK_V": (256, 512, 1024, 2048, 4096), "num_warps": (1, 2, 4, 8),
           "num_stages": (1, 2, 3)}
SHAPES = ((1, 8, 49152), (16, 8, 49152), (16, 16, 4096))  # rows, drafted, vocabulary
CONTEXT = 256  # cached positions a row holds when its plain step is timed
ROWS = (1, 16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autospec.kernels.device_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-tests", action="store_true", help="leave out step 1")
    parser.add_argument("--pairs", default="reference,smollm2",
                        help="pairs whose plain step is timed (step 3; comma-separated)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'no CUDA device: CPU'}")
    report = {"device": device}
    if not args.skip_tests:
        report["kernel_tests"] = kernel_tests()
    report["greedy_verify"] = verify_tilings(device, args.repeats)
    report["plain_decoding"] = plain_roofline(device, args.repeats, args.pairs.split(","))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    failed = report.get("kernel_tests") not in (None, "passed", "skipped") or any(
        not shape["identical"] for shape in report["greedy_verify"])
    return 1 if failed else 0


def kernel_tests() -> str:
    """Step 1: 'passed', 'failed' or 'skipped' (no tests beside the package)."""
    tests = Path(__file__).resolve().parent.parent / "tests" / "kernels"
    if not tests.is_dir():
        print("kernel tests: skipped (run from a checkout to include them)")
        return "skipped"
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(tests)], cwd=tests.parent.parent)
    print(f"kernel tests: {'passed' if code == 0 else 'failed'}")
    return "passed" if code == 0 else "failed"


def _time(fn, device: str, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call (synchronised on CUDA)."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verify_tilings(device: str, repeats: int) -> list[dict]:
    """Step 2: per shape, the reference's microseconds and each tiling's (CUDA only)."""
    from autospec.kernels.verify import greedy_verify_reference, greedy_verify_triton
    out = []
    generator = torch.Generator().manual_seed(0)
    for rows, drafted, vocab in SHAPES:
        logits = torch.randn(rows, drafted + 1, vocab, generator=generator).to(device)
        drafts = logits[:, :drafted].argmax(-1)  # the target's own choices: all accepted ...
        drafts[rows // 2:, drafted // 2] += 1  # ... but for half the rows, rejected midway
        drafts %= vocab
        counts = torch.full((rows,), drafted, dtype=torch.int64, device=device)
        want = greedy_verify_reference(drafts, counts, logits)
        shape = {"rows": rows, "drafted": drafted, "vocab": vocab, "identical": True,
                 "reference_us": 1e6 * _time(lambda: greedy_verify_reference(drafts, counts, logits),
                                             device, repeats)}
        if device == "cuda":
            timed = []
            for values in itertools.product(*TILINGS.values()):
                tiling = dict(zip(TILINGS, values))
                got = greedy_verify_triton(drafts, counts, logits, **tiling)
                same = all(torch.equal(g, w) for g, w in zip(got, want))
                shape["identical"] &= same
                seconds = _time(lambda: greedy_verify_triton(drafts, counts, logits, **tiling),
                                device, repeats)
                timed.append({**tiling, "us": 1e6 * seconds, "identical": same})
            shape["tilings"] = timed
            best = min(timed, key=lambda t: t["us"])
            shape["best"] = best
            line = (f"Triton best {best['us']:.1f} us at BLOCK_V={best['BLOCK_V']} "
                    f"num_warps={best['num_warps']} num_stages={best['num_stages']} "
                    f"({len(timed)} tilings, all identical: {shape['identical']})")
        else:
            line = "Triton not timed (no CUDA device)"
        print(f"greedy_verify {rows} x {drafted} x {vocab}: reference "
              f"{shape['reference_us']:.1f} us; {line}")
        out.append(shape)
    return out


def plain_roofline(device: str, repeats: int, pairs: list[str]) -> list[dict]:
    """Step 3: per pair and rows, a one-token step's bandwidth and its share of the peak."""
    from autospec.engine.bandwidth import peak_bandwidth_gbs
    from autospec.models.attention import pack_rows
    from autospec.models.kv import RowCache, cache_kwarg
    from autospec.models.kv import kv_bytes_per_token
    from autospec.models.pair import load_named_pair, weight_bytes
    from autospec.models.pairs import named_pair
    peak = peak_bandwidth_gbs(device)
    out = []
    for name in pairs:
        try:
            named_pair(name).locate()
        except Exception as exc:  # SmolLM2 not fetched (no hub on a lent machine): say so
            print(f"plain decoding, {name}: skipped ({exc})")
            continue
        model = load_named_pair(name).target.to(device)
        pack_rows(model)
        for rows in ROWS:
            cache = RowCache(model, rows, CONTEXT + 8)
            slots = [cache.claim() for _ in range(rows)]
            with torch.inference_mode():
                for slot in slots:
                    cache.forward(model, cache_kwarg(model), [slot], [[1] * CONTEXT],
                                  model.config.max_position_embeddings, last=1)
                    cache.lengths[slot] = CONTEXT
                seconds = _time(lambda: cache.forward(model, cache_kwarg(model), slots,
                                                      [[1]] * rows,
                                                      model.config.max_position_embeddings),
                                device, repeats)
            moved = weight_bytes(model) + rows * CONTEXT * kv_bytes_per_token(model)
            gbs = moved / seconds / 1e9
            print(f"plain decoding, {name}, {rows} row(s): {1e3 * seconds:.2f} ms a step, "
                  f"{gbs:.1f} GB/s = {gbs / peak:.0%} of the peak ({peak:.0f} GB/s)")
            out.append({"pair": name, "rows": rows, "step_ms": 1e3 * seconds, "gbs": gbs,
                        "peak_gbs": peak, "fraction": gbs / peak})
    return out


if __name__ == "__main__":
    sys.exit(main())
