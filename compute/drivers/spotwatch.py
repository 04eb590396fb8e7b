"""The watcher Kumo ships into every guest through vendor data: it learns of a scheduled
stop (a spot eviction notice, or reclamation) from the metadata endpoint, runs the user's
hook, and acknowledges, so the VM is stopped as soon as the hook is done and before the
notice ends.

In the guest:

- ``/usr/local/lib/kumo/spot-watch.py`` (Python 3, standard library only: cloud-init brings
  Python) polls ``$KUMO_METADATA_URL/spot/instance-action`` every ``KUMO_SPOT_POLL_S``
  seconds (default 2) with the token from ``/etc/kumo/metadata.env`` (root only);
- on an action (``{"action": "stop"|"terminate", "time": <deadline>}``) it runs the user's
  hook once: the executable named by ``KUMO_SPOT_HOOK`` in ``/etc/kumo/spot.env`` (a file
  the user writes from their user-data; no hook by default), as root, with the action and
  the deadline as arguments and at most until two seconds before the deadline; then it
  POSTs ``/spot/acknowledge`` (the notice ends at once and Kumo stops the VM), again every
  two seconds while the endpoint does not answer or answers 5xx, until the deadline, and
  writes ``/run/kumo/spot-acknowledged`` so it acts once per boot;
- ``spot-watch.py checkpoint`` (as root, from the user's job after it saved its work) POSTs
  ``/spot/checkpoint``: of equally few victims, preemption then evicts first the VMs that
  would lose the least work;
- ``kumo-spot-watch.service`` runs it (restarted if it dies), enabled by vendor data's
  ``runcmd`` at first boot. Its output goes to the journal and the serial console.

A metadata endpoint that does not answer is retried at the next poll; a hook that fails or
overruns is logged and the acknowledgement is still sent (the deadline holds either way).
"""

from __future__ import annotations

SCRIPT_PATH = "/usr/local/lib/kumo/spot-watch.py"
UNIT_PATH = "/etc/systemd/system/kumo-spot-watch.service"
ENABLE = ("systemctl", "enable", "--now", "kumo-spot-watch.service")

SCRIPT = r'''#!/usr/bin/python3
"""Kumo's spot watcher (shipped by Kumo's vendor data; see kumo-spot-watch.service)."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

METADATA_ENV = "/etc/kumo/metadata.env"
SPOT_ENV = "/etc/kumo/spot.env"
DONE = "/run/kumo/spot-acknowledged"


def read_env(path):
    values = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    values[key.strip()] = value.strip().strip('"')
    except OSError:
        pass
    return values


def say(message):
    print(f"kumo-spot-watch: {message}", flush=True)


def request(url, token, method="GET"):
    req = urllib.request.Request(url, method=method, headers={"X-Kumo-Metadata-Token": token})
    with urllib.request.urlopen(req, timeout=5) as answer:
        return json.loads(answer.read() or b"{}")


def seconds_left(deadline):
    try:
        when = datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return 10.0
    return (when - datetime.now(timezone.utc)).total_seconds()


def act(base, token, action):
    spot = read_env(SPOT_ENV)
    hook = spot.get("KUMO_SPOT_HOOK", "")
    deadline = str(action.get("time", ""))
    say(f"{action.get('action')} scheduled at {deadline}")
    if hook:
        budget = max(1.0, seconds_left(deadline) - 2.0)
        try:
            done = subprocess.run([hook, str(action.get("action")), deadline], timeout=budget)
            say(f"hook {hook} exited {done.returncode}")
        except (OSError, subprocess.SubprocessError) as e:
            say(f"hook {hook} failed: {e}")
    os.sync()
    acknowledge(base, token, deadline)
    os.makedirs(os.path.dirname(DONE), exist_ok=True)
    open(DONE, "w").close()


def acknowledge(base, token, deadline, poll=2.0):
    """POST /spot/acknowledge until Kumo takes it. An endpoint that does not answer, or
    answers 5xx, is asked again every ``poll`` seconds until the deadline (when Kumo stops
    the VM anyway); a 4xx (no notice any more) is final."""
    end = time.monotonic() + max(0.0, seconds_left(deadline))
    while True:
        try:
            request(base + "/spot/acknowledge", token, method="POST")
            say("acknowledged")
            return True
        except urllib.error.HTTPError as e:
            if e.code < 500:
                say(f"acknowledge refused: {e}")
                return False
            error = e
        except (urllib.error.URLError, OSError, ValueError) as e:
            error = e
        if time.monotonic() + poll >= end:
            say(f"acknowledge failed: {error}")
            return False
        say(f"acknowledge not taken ({error}); again in {poll:g} s")
        time.sleep(poll)


def checkpoint():
    """``spot-watch.py checkpoint``: tell Kumo the job saved its work (run it as root after
    each checkpoint); an eviction then loses only what the job does from now on."""
    meta = read_env(METADATA_ENV)
    base = meta.get("KUMO_METADATA_URL", "").rstrip("/")
    token = meta.get("KUMO_METADATA_TOKEN", "")
    if not (base and token):
        say(f"no metadata URL or token in {METADATA_ENV} (run as root)")
        return 1
    try:
        answer = request(base + "/spot/checkpoint", token, method="POST")
    except (urllib.error.URLError, OSError, ValueError) as e:
        say(f"checkpoint not recorded: {e}")
        return 1
    say(f"checkpoint recorded at {answer.get('checkpointed_at')}")
    return 0


def main():
    if sys.argv[1:] == ["checkpoint"]:
        return checkpoint()
    while True:
        meta = read_env(METADATA_ENV)
        base = meta.get("KUMO_METADATA_URL", "").rstrip("/")
        token = meta.get("KUMO_METADATA_TOKEN", "")
        poll = float(read_env(SPOT_ENV).get("KUMO_SPOT_POLL_S", "2") or 2)
        if base and token and not os.path.exists(DONE):
            try:
                action = request(base + "/spot/instance-action", token)
            except urllib.error.HTTPError as e:
                action = None
                if e.code != 404:
                    say(f"instance-action answered {e.code}")
            except (urllib.error.URLError, OSError, ValueError):
                action = None
            if action and action.get("action"):
                act(base, token, action)
        time.sleep(poll)


if __name__ == "__main__":
    sys.exit(main())
'''

UNIT = f"""[Unit]
Description=Kumo spot watcher: the user's hook, then acknowledge, before a scheduled stop
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/bin/python3 {SCRIPT_PATH}
Restart=always
RestartSec=2
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""


def guest_files() -> dict[str, str]:
    """The watcher's files, by guest path (readable by everyone: no secret in them)."""
    return {SCRIPT_PATH: SCRIPT, UNIT_PATH: UNIT}
