"""kernels/device_check.py, the prepared run for a machine with a GPU, runs here without one:
the reference kernel timed and the plain step against the copy peak."""
import json

import pytest
import torch

from autospec.kernels import device_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without a GPU")
def test_the_device_check_runs_without_a_gpu(tmp_path, capsys):
    report_path = tmp_path / "device.json"
    assert device_check.main(["--skip-tests", "--repeats", "2", "--pairs", "reference",
                              "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Triton not timed" in out
    report = json.loads(report_path.read_text())
    assert report["device"] == "cpu"
    assert [(s["rows"], s["vocab"]) for s in report["greedy_verify"]] == [
        (rows, vocab) for rows, _, vocab in device_check.SHAPES]
    assert all(s["identical"] and s["reference_us"] > 0 for s in report["greedy_verify"])
    steps = report["plain_decoding"]
    assert [(s["pair"], s["rows"]) for s in steps] == [("reference", 1), ("reference", 16)]
    assert all(0 < s["fraction"] and s["gbs"] > 0 for s in steps)
