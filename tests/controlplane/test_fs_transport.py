"""The embedded broker's exchange tables appear whole: a process that binds or publishes to
an exchange while another process is making its table never reads it empty (seen as two host
agents dying at start-up with ``JSONDecodeError`` inside kombu's filesystem transport)."""

import pathlib

import pytest
from kombu import Connection

from controlplane.broker import EMBEDDED_BROKER_URL, transport_options


@pytest.fixture
def channels(tmp_path):
    options = transport_options(EMBEDDED_BROKER_URL, tmp_path)
    connections = [Connection(EMBEDDED_BROKER_URL, transport_options=options) for _ in range(3)]
    yield [c.default_channel for c in connections]
    for c in connections:
        c.release()


def _queues(channel, exchange):
    return sorted(binding.queue for binding in channel.get_table(exchange))


def test_a_binding_made_while_another_process_makes_the_table_keeps_both(channels, monkeypatch):
    first, second, reader = channels
    real_open = pathlib.Path.open
    seen_meanwhile = []

    def open_then_let_the_other_process_in(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and not seen_meanwhile:
            # The first process has just opened a file to write the table: the second
            # process publishes (reads the table) and binds its own queue right now.
            seen_meanwhile.append(_queues(reader, "kumo"))
            second._queue_bind("kumo", "host.b", "", "host.b")
        return handle

    monkeypatch.setattr(pathlib.Path, "open", open_then_let_the_other_process_in)
    first._queue_bind("kumo", "host.a", "", "host.a")
    monkeypatch.undo()

    assert seen_meanwhile == [[]]  # the table did not exist yet, rather than empty and broken
    assert _queues(reader, "kumo") == ["host.a", "host.b"]
    control = pathlib.Path(reader.control_folder)
    assert sorted(p.name for p in control.iterdir()) == ["kumo.exchange"]  # nothing partial


def test_binding_again_or_to_a_table_that_exists_adds_each_queue_once(channels):
    first, second, reader = channels
    first._queue_bind("kumo", "host.a", "", "host.a")
    second._queue_bind("kumo", "host.b", "", "host.b")
    first._queue_bind("kumo", "host.a", "", "host.a")
    assert _queues(reader, "kumo") == ["host.a", "host.b"]
