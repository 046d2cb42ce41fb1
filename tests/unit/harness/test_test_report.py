"""The run's last lines: failures named with their first message line, the slowest tests, the counts."""

from __future__ import annotations

from harness import test_report

RESULTS = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_demo" name="test_trains" time="412.5"/>
<testcase classname="tests.unit.test_a" name="test_fails" time="1.25">
  <failure message="AssertionError: reward 0.0 &lt; 0.5&#10;second line">trace</failure></testcase>
<testcase classname="tests.unit.test_a" name="test_setup" time="0.5">
  <error message="fixture broke">t</error></testcase>
<testcase classname="tests.unit.test_a" name="test_skip" time="0.0"><skipped message="no gpu"/></testcase>
</testsuite></testsuites>"""


def test_failures_come_last_with_their_first_message_line() -> None:
    lines = test_report.report(test_report.read_cases(RESULTS)).splitlines()
    assert lines[1].split() == ["412.5s", "tests.e2e.test_demo::test_trains"]
    assert lines[-3] == "FAILED tests.unit.test_a::test_fails: AssertionError: reward 0.0 < 0.5"
    assert lines[-2] == "ERROR tests.unit.test_a::test_setup: fixture broke"
    assert lines[-1] == "== 1 error, 1 failed, 1 passed, 1 skipped in 6.9 min of test time =="


def test_a_missing_report_is_an_error(tmp_path) -> None:
    assert test_report.main([str(tmp_path / "absent.xml")]) == 1
