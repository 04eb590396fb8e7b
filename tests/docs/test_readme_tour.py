"""The README's five-minute tour, run as written against a live Kumo, so it cannot rot.

Every ``sh`` block of the README's tour section is run in order in one bash (``-euo
pipefail``: a failing command, an HTTP error through ``curl --fail-with-body`` or an
undefined variable stops it), with only what a reader has after ``make run``: ``K`` (the
server), ``KUMO_VAR_DIR`` (where ``make run`` put the generated passwords) and an empty home.
The server is gunicorn with the controller and a simulated host's agent, bootstrapped as
``make run`` does, so the VM the tour creates really runs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "@@tour-block "

pytestmark = pytest.mark.e2e


def tour_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def test_the_tour_has_blocks_that_define_what_they_use():
    blocks = tour_blocks()
    assert len(blocks) >= 5
    script = "\n".join(blocks)
    for name in ("K", "PW", "CSRF", "TOKEN", "AUTH", "P", "IMAGE", "OP", "STATE"):
        assert re.search(rf"^\s*{name}=", script, re.M), f"the tour never defines {name}"


def test_the_readme_tour_runs_against_a_live_kumo(server, hosts, tmp_path):
    var = server.fleet.env["KUMO_VAR_DIR"]
    subprocess.run(
        [sys.executable, "manage.py", "bootstrap"],
        cwd=ROOT, env=server.fleet.env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    script = "".join(f"echo '{MARK}{n}' >&2\n{block}\n" for n, block in enumerate(tour_blocks(), 1))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "K": server.url,
        "KUMO_VAR_DIR": var,
        "KUMO_CONFIG": str(home / "kumo.json"),
    }
    if "PYTHONPATH" in os.environ:  # the SDK under test, for .venv/bin/kumo
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    reached = re.findall(rf"{MARK}(\d+)", run.stderr)
    assert run.returncode == 0, (
        f"tour block {reached[-1] if reached else '?'} failed:\n{run.stderr}\n{run.stdout}"
    )
    out = run.stdout.splitlines()
    assert '{"slug":"demo","my_role":"member"}' in out
    # bob's first login through the demo university made his account from its attributes
    bob = {
        "username": "bob@demo-university.example",
        "display_name": "Bob Baba",
        "organisation": "Demo University",
        "identities": ["saml"],
    }
    assert json.dumps(bob, separators=(",", ":"), ensure_ascii=False) in out
    assert "cpu-4" in out
    [vm] = [json.loads(line) for line in out if line.startswith('{"name":"train-1"')]
    assert vm["state"] == "running" and vm["host"] == hosts[0]
    assert vm["addresses"][0].startswith("10.0.0.")
    table = [line.split() for line in out if line.startswith("train-1 ")]  # kumo vm list
    assert table and "running" in table[0]
    assert json.loads((home / "kumo.json").read_text())["project"] == "demo"
