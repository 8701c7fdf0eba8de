"""tools/bench/bandwidth.py's verdicts: a row's share of its limit and whether it meets the
issue's target, and the paths it accepts."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bandwidth  # noqa: E402


def test_a_row_below_its_target_is_not_met():
    t = bandwidth.Table()
    t.add(1, "save: to durable", 1_000_000_000, 2.0, "dd write", 1.0, 90)
    r = t.rows[-1]
    assert r["gbps"] == pytest.approx(0.5)
    assert r["pct"] == pytest.approx(50)
    assert r["met"] == "not met"


def test_a_row_at_its_target_is_met():
    t = bandwidth.Table()
    t.add(1, "reshard", 800_000_000, 1.0, "read+write", 1.0, 80)
    assert t.rows[-1]["met"] == "met"


def test_a_load_is_compared_by_the_bytes_it_reads_not_the_bytes_it_delivers():
    t = bandwidth.Table()
    # Delivers 2 GB (replicas) but reads the 1 GB checkpoint once in 1 s, against 1 GB/s.
    t.add(1, "load", 2_000_000_000, 1.0, "cold read", 1.0, 90, compare_bytes=1_000_000_000)
    r = t.rows[-1]
    assert r["gbps"] == pytest.approx(2.0)
    assert r["pct"] == pytest.approx(100)
    assert r["met"] == "met"


def test_a_failed_benchmark_is_a_failed_row_in_the_markdown():
    t = bandwidth.Table()
    t.failed(1, "transfer_bench", "exited 1")
    md = t.markdown().splitlines()
    assert len(md) == 3
    assert "| FAILED | exited 1 |" in md[2]


def test_an_unknown_path_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bandwidth.py", "--only", "save,teleport"])
    with pytest.raises(SystemExit) as e:
        bandwidth.main()
    assert e.value.code == 2
    assert "teleport" in capsys.readouterr().err
