"""Burrow-style lag evaluation: one hand-made snapshot sequence per status, thresholds, group rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.reports.lag_status import (
    Thresholds,
    evaluate,
    load_window,
    parse_thresholds,
)
from schemas.reports import CONSUMER_LAG_SCHEMA, CONSUMER_LAG_STATUS_SCHEMA

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def history(*partitions: dict) -> pa.Table:
    """Rows of ``consumer_lag`` from partition specs: ``seq`` is [(seconds after T0, offset, max)],
    lag = max - (offset or 0), lag_seconds = ``lag_s`` (default: lag / 10)."""
    rows = []
    for spec in partitions:
        for t, offset, max_offset in spec["seq"]:
            lag = max_offset - (offset or 0)
            ts = T0 + timedelta(seconds=t)
            rows.append({
                "snapshot_ts": ts, "snapshot_id": f"lag-{t}", "broker_name": spec.get("broker", "broker-a"),
                "consumer_group": spec.get("group", "G"), "topic": spec.get("topic", "T"),
                "queue_id": spec.get("queue", 0), "consumer_offset": offset, "min_offset": 0,
                "max_offset": max_offset, "lag_messages": lag, "next_store_timestamp_ms": None,
                "newest_store_timestamp_ms": None, "lag_seconds": spec.get("lag_s", lag / 10),
                "lost_messages": 0, "offset_source": "none" if offset is None else "consumerOffset.json"})
    return pa.Table.from_pylist(rows, schema=CONSUMER_LAG_SCHEMA)


def one(seq, stop_after_s=600.0, window=10, thresholds=None, **spec) -> dict:
    out = evaluate(history({"seq": seq, **spec}), window=window, stop_after_s=stop_after_s, thresholds=thresholds)
    assert out.schema == CONSUMER_LAG_STATUS_SCHEMA
    part = [r for r in out.to_pylist() if r["level"] == "partition"]
    assert len(part) == 1
    return part[0]


def test_ok_when_lag_goes_down():
    r = one([(0, 0, 50), (60, 10, 55), (120, 20, 60)])
    assert (r["status"], r["reason"], r["snapshots"], r["lag_messages"]) == \
        ("OK", "lag went down within 3 snapshots: 50 -> 40", 3, 40)
    assert r["evaluated_at"] == T0 + timedelta(seconds=120) and r["snapshot_id"] == "lag-120"


def test_ok_when_caught_up_now_or_within_the_window():
    assert one([(0, 5, 10), (60, 5, 20), (120, 30, 30)])["reason"] == "lag 0"
    # offsets still, lag growing: would be STALL, but the consumer was caught up at the start (Burrow rule 1)
    r = one([(0, 10, 10), (60, 10, 15), (120, 10, 20)])
    assert (r["status"], r["reason"]) == ("OK", "lag was 0 within the last 3 snapshots; now 10")


def test_one_snapshot_has_no_trend():
    r = one([(0, 0, 100)])
    assert (r["status"], r["reason"], r["snapshots"]) == ("OK", "1 snapshot, lag 100: no trend yet", 1)


def test_warn_when_lag_never_decreases():
    r = one([(0, 0, 10), (60, 5, 20), (120, 10, 30), (180, 20, 40)])
    assert (r["status"], r["reason"]) == ("WARN", "lag did not decrease over 4 snapshots: 10 -> 20")
    # the same lag between every pair counts as not decreasing (Burrow's "same or increases")
    assert one([(0, 0, 10), (60, 5, 15)])["status"] == "WARN"


def test_stall_when_offsets_do_not_move_within_stop_after():
    r = one([(0, 5, 10), (60, 5, 12), (120, 5, 15)])
    assert (r["status"], r["reason"]) == ("STALL", "offset 5 unchanged over 3 snapshots (120 s) with lag 5 -> 10")
    assert one([(0, 5, 10), (60, 5, 10)])["status"] == "STALL"  # producers idle too, not yet stop-after


def test_stop_when_offsets_do_not_move_for_stop_after():
    r = one([(0, 5, 10), (300, 5, 10), (600, 5, 10)])
    assert (r["status"], r["reason"]) == \
        ("STOP", "offset 5 unchanged for 600 s over 3 snapshots with lag > 0 (stop after 600 s)")
    # the same sequence with a longer stop-after is only STALL; growing lag does not matter
    assert one([(0, 5, 10), (300, 5, 20), (600, 5, 30)], stop_after_s=900)["status"] == "STALL"
    assert one([(0, 5, 10), (300, 5, 20), (600, 5, 30)], stop_after_s=599.5)["status"] == "STOP"


def test_never_committed_group_stalls_then_stops():
    assert one([(0, None, 10), (60, None, 10)])["status"] == "STALL"
    r = one([(0, None, 10), (700, None, 10)])
    assert (r["status"], r["reason"]) == \
        ("STOP", "offset none unchanged for 700 s over 2 snapshots with lag > 0 (stop after 600 s)")


def test_rewind_when_the_offset_goes_back():
    r = one([(0, 10, 30), (60, 20, 30), (120, 5, 30)])
    assert (r["status"], r["reason"]) == \
        ("REWIND", "offset went back from 20 to 5 between snapshots 2030-01-01T00:01:00Z and 2030-01-01T00:02:00Z")
    # a caught-up consumer reset to an old offset: Burrow's lag-0 rule would hide it
    assert one([(0, 30, 30), (60, 5, 30), (120, 6, 31)])["status"] == "REWIND"
    # rewound and caught up again: lag 0 now wins
    assert one([(0, 30, 30), (60, 5, 30), (120, 30, 30)])["status"] == "OK"
    # a commit after never committing is no rewind
    assert one([(0, None, 30), (60, 0, 30), (120, 10, 30)])["status"] == "OK"


def test_window_keeps_the_last_n_snapshots():
    seq = [(0, 10, 30), (60, 5, 30), (120, 6, 40), (180, 7, 50), (240, 8, 60)]
    assert one(seq, window=5)["status"] == "REWIND"
    r = one(seq, window=3)  # the rewind left the window; lag 34 -> 43 -> 52 grows
    assert (r["status"], r["snapshots"], r["reason"]) == ("WARN", 3, "lag did not decrease over 3 snapshots: 34 -> 52")


def test_thresholds_make_a_partition_at_least_warn():
    limits = Thresholds({"*": 1000, "G": 30}, {"*": 2.5})
    r = one([(0, 0, 50), (60, 20, 60)], thresholds=limits)  # lag going down: OK by the rules
    assert (r["status"], r["max_lag_messages"], r["max_lag_seconds"]) == ("WARN", 30, 2.5)
    assert r["reason"] == "lag went down within 2 snapshots: 50 -> 40; lag 40 > max 30 messages; lag 4 s > max 2.5 s"
    r = one([(0, 0, 50), (60, 20, 60)], thresholds=limits, group="other")
    assert (r["status"], r["max_lag_messages"], r["reason"]) == \
        ("WARN", 1000, "lag went down within 2 snapshots: 50 -> 40; lag 4 s > max 2.5 s")
    r = one([(0, 5, 10), (300, 5, 10), (600, 5, 10)], thresholds=Thresholds({"G": 1}, {}))  # a worse status stays
    assert (r["status"], r["reason"]) == \
        ("STOP", "offset 5 unchanged for 600 s over 3 snapshots with lag > 0 (stop after 600 s); lag 5 > max 1 messages")
    assert one([(0, 0, 50), (60, 20, 60)], thresholds=Thresholds({"G": 40}, {"G": 4.0}))["status"] == "OK"  # not above


def test_group_rows_err_warn_ok():
    h = history(
        {"group": "A", "topic": "T", "queue": 0, "seq": [(0, 0, 50), (60, 20, 60)], "lag_s": 4.0},   # OK
        {"group": "A", "topic": "T", "queue": 1, "seq": [(0, 5, 10), (60, 5, 12)], "lag_s": 9.5},     # STALL
        {"group": "A", "topic": "U", "queue": 0, "seq": [(0, 0, 10), (60, 5, 20)], "lag_s": 1.0},     # WARN
        {"group": "B", "topic": "T", "queue": 0, "seq": [(0, 0, 10), (60, 5, 20)], "lag_s": 1.0},     # WARN
        {"group": "B", "topic": "T", "queue": 1, "seq": [(0, 0, 10), (60, 10, 10)], "lag_s": 0.0},    # OK
        {"group": "C", "topic": "T", "queue": 0, "seq": [(0, 0, 10), (60, 10, 10)], "lag_s": 0.0},    # OK
        {"group": "D", "topic": "T", "queue": 0, "seq": [(0, 0, 10)], "lag_s": 7.0},                   # gone
        {"group": "D", "broker": "broker-b", "topic": "T", "queue": 0, "seq": [(0, 9, 10)], "lag_s": 7.0},
    )
    out = evaluate(h, thresholds=Thresholds({"C": 0}, {}))
    got = [(r["broker_name"], r["consumer_group"], r["level"], r["topic"], r["queue_id"], r["status"],
            r["lag_messages"], r["lag_seconds"], r["snapshots"]) for r in out.to_pylist()]
    assert got == [
        ("broker-a", "A", "partition", "T", 0, "OK", 40, 4.0, 2),
        ("broker-a", "A", "partition", "T", 1, "STALL", 7, 9.5, 2),
        ("broker-a", "A", "partition", "U", 0, "WARN", 15, 1.0, 2),
        ("broker-a", "A", "group", None, None, "ERR", 62, 9.5, 2),
        ("broker-a", "B", "partition", "T", 0, "WARN", 15, 1.0, 2),
        ("broker-a", "B", "partition", "T", 1, "OK", 0, 0.0, 2),
        ("broker-a", "B", "group", None, None, "WARN", 15, 1.0, 2),
        ("broker-a", "C", "partition", "T", 0, "OK", 0, 0.0, 2),
        ("broker-a", "C", "group", None, None, "OK", 0, 0.0, 2),
        ("broker-b", "D", "partition", "T", 0, "OK", 1, 7.0, 1),
        ("broker-b", "D", "group", None, None, "OK", 1, 7.0, 1),
    ]  # broker-a's D is not in broker-a's newest snapshot: not evaluated
    groups = {r["consumer_group"]: r for r in out.to_pylist() if r["level"] == "group"}
    assert groups["A"]["reason"] == "3 partitions; not OK: T/1 STALL, U/0 WARN"
    assert groups["A"]["evaluated_at"] == T0 + timedelta(seconds=60) and groups["A"]["snapshot_id"] == "lag-60"
    assert groups["C"]["max_lag_messages"] == 0 and groups["C"]["reason"] == "1 partitions"


def test_group_total_over_its_threshold_warns():
    h = history({"queue": 0, "seq": [(0, 0, 50), (60, 30, 60)]}, {"queue": 1, "seq": [(0, 0, 50), (60, 30, 60)]})
    rows = evaluate(h, thresholds=Thresholds({"G": 50}, {})).to_pylist()
    assert [r["status"] for r in rows] == ["OK", "OK", "WARN"]
    assert rows[2]["reason"] == "2 partitions; group lag 60 > max 50 messages"


def test_empty_history():
    assert evaluate(history()).num_rows == 0


def test_parse_thresholds():
    assert parse_thresholds(["G=10", "*=5"], int, "--max-lag-messages") == {"G": 10, "*": 5}
    assert parse_thresholds(["G=1.5"], float, "--max-lag-seconds") == {"G": 1.5}
    for bad, msg in [("G", "is not GROUP=VALUE"), ("=3", "is not GROUP=VALUE"), ("G=x", "is not an integer"),
                     ("G=-1", "must be a finite number >= 0")]:
        with pytest.raises(ValueError, match=msg):
            parse_thresholds([bad], int, "--max-lag-messages")
    with pytest.raises(ValueError, match="more than once"):
        parse_thresholds(["G=1", "G=2"], int, "--max-lag-messages")
    with pytest.raises(ValueError, match="finite"):
        parse_thresholds(["G=inf"], float, "--max-lag-seconds")


def test_load_window_reads_the_last_n_snapshots_per_broker(tmp_path):
    from pipelines.lake import append_arrow

    lake = tmp_path / "lake"
    h = history({"seq": [(t, t, t + 10) for t in range(0, 300, 60)]},
                {"broker": "broker-b", "seq": [(t, t, t + 10) for t in range(30, 150, 60)]})
    for ts in sorted(set(h.column("snapshot_ts").to_pylist())):
        append_arrow(lake, "consumer_lag", h.filter(pc.field("snapshot_ts") == ts), partition_by=["broker_name"])
    got = load_window(lake, ["broker-a", "broker-b"], window=3)
    pairs = sorted((r["broker_name"], int((r["snapshot_ts"] - T0).total_seconds())) for r in got.to_pylist())
    assert pairs == [("broker-a", 120), ("broker-a", 180), ("broker-a", 240), ("broker-b", 30), ("broker-b", 90)]
    got = load_window(lake, ["broker-a"], window=2, until=T0 + timedelta(seconds=150))
    assert sorted(int((r["snapshot_ts"] - T0).total_seconds()) for r in got.to_pylist()) == [60, 120]
    assert load_window(tmp_path / "nothing", ["broker-a"]).num_rows == 0
