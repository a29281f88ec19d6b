"""broker.pressure: the CPU pressure figure read from the kernel's pressure stall information."""

from __future__ import annotations

from collections import deque

from broker.pressure import CpuPressure, pressure_parse, pressure_share

KERNEL = ("some avg10=61.20 avg60=55.03 avg300=31.33 total=15952246693\n"
          "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")  # /proc/pressure/cpu as Linux 6 writes it


def test_the_some_lines_total_is_read():
    assert pressure_parse(KERNEL) == 15952246693


def test_a_file_without_the_some_line_or_its_total_gives_none():
    assert pressure_parse("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") is None
    assert pressure_parse("some avg10=1.00 total=x\n") is None
    assert pressure_parse("") is None


def test_the_share_is_the_stalled_time_over_the_last_window():
    # 0.6 s stalled in the last second; the sample 2 s back is outside the window
    samples = deque([(0.0, 0), (2.0, 1_000_000), (2.5, 1_300_000), (3.0, 1_600_000)])
    assert abs(pressure_share(samples, window=1.0) - 0.6) < 1e-9
    # a full second stalled on each of two cores reads as 1: the share is of wall time
    assert pressure_share(deque([(0.0, 0), (1.0, 2_000_000)]), window=1.0) == 1.0


def test_one_sample_gives_no_figure():
    assert pressure_share(deque([(1.0, 5)])) is None
    assert pressure_share(deque()) is None


def test_a_machine_without_the_file_gives_none_and_stops_reading(tmp_path):
    missing = CpuPressure(str(tmp_path / "no-such-file"))
    assert missing.share() is None
    assert missing.available is False


def test_the_file_is_read_and_two_samples_give_a_share(tmp_path):
    path = tmp_path / "cpu"
    path.write_text(KERNEL)
    reader = CpuPressure(str(path))
    assert reader.share() is None  # one sample
    path.write_text(KERNEL.replace("total=15952246693", "total=15952446693"))  # +0.2 s stalled
    reader._next = 0.0  # (the next look is due now)
    share = reader.share()
    assert share is not None and 0.0 < share <= 1.0
