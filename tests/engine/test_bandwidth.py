"""The copy peak: a measurement under load cannot stand as the peak; the cache keeps the highest
one seen, the recent ones beside it, and says when the peak was measured."""
import json

from autospec.engine import bandwidth


def test_the_cache_keeps_the_highest_measurement_and_the_recent_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSPEC_CACHE", str(tmp_path))
    measured = iter([22.1, 34.8, 30.0])  # under load first, then quiet, then a busier moment
    measure = lambda: next(measured)  # noqa: E731
    first = bandwidth._cached("copy|", measure)
    assert first["gbs"] == 22.1 and first["this_run"] == 22.1 and first["source"] == "measured"
    assert bandwidth._cached("copy|", measure)["source"] == "cache"  # no re-measure unless asked
    quiet = bandwidth._cached("copy|", measure, remeasure=True)
    assert quiet["gbs"] == 34.8 and quiet["this_run"] == 34.8
    busy = bandwidth._cached("copy|", measure, remeasure=True)
    assert busy["gbs"] == 34.8 and busy["this_run"] == 30.0  # load does not lower the peak
    assert busy["measured_at"] == quiet["measured_at"]  # the peak's own time
    assert busy["recent"] == [22.1, 34.8, 30.0]
    assert busy["spread"] == (34.8 - 22.1) / 34.8


def test_a_cache_written_before_it_kept_the_recent_ones_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSPEC_CACHE", str(tmp_path))
    key = bandwidth._cached("probe|", lambda: 1.0)  # learn the key this machine writes
    path = tmp_path / "peak_bandwidth.json"
    written = json.loads(path.read_text())
    (name,) = [k for k in written if not k.startswith("v2|")]
    assert written[name] == 1.0  # what versions before this one read: a float, still there
    path.write_text(json.dumps({name: 27.4}))  # the old format: one float
    old = bandwidth._cached("probe|", lambda: 0.0)
    assert old["gbs"] == 27.4 and old["source"] == "cache" and key["gbs"] == 1.0
    path.write_text("{not json")  # a damaged cache: measured again, and rewritten
    assert bandwidth._cached("probe|", lambda: 5.0)["gbs"] == 5.0
