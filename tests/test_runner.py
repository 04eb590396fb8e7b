"""``make test``'s runner (tests/run.py) ends with a recap of each failing test: the tail of a
long log, which may be all a CI excerpt keeps, names the test, where it failed and why."""

import subprocess
import sys
from pathlib import Path

from tests import run

FAILING = """
def wait_for_it():
    raise AssertionError("timed out waiting for the guest\\n--- VMs (id, state)\\n('v1', 'x')")


def test_waits():
    wait_for_it()


def test_passes():
    assert True
"""


def test_the_recap_names_each_failure_its_lines_and_its_error(tmp_path: Path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_sample.py").write_text(FAILING)
    report = tmp_path / "guest.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null",
         f"--junitxml={report}", "tests"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout

    recap = run.failures(report)
    assert recap[0].startswith("\nkumo test run: guest pass failed ")
    assert recap[0].endswith(
        "test_sample::test_waits at tests/test_sample.py:7 > tests/test_sample.py:3"
    )
    assert recap[1:] == [
        "  AssertionError: timed out waiting for the guest",
        "  --- VMs (id, state)",
        "  ('v1', 'x')",
    ]


def test_a_pass_without_a_report_has_no_recap(tmp_path: Path):
    assert run.failures(tmp_path / "embedded.xml") == []
