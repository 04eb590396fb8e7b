"""kombu's filesystem transport, with messages and exchange tables that appear whole.

kombu writes a message by creating its file in the queue folder and then writing into it,
while a consumer takes any file it sees: a consumer that looks between the two reads an
empty message, and the worker stops with ``JSONDecodeError`` (seen with Kumo's controller
under a burst of agent reports). Here a message is written under a name no consumer
matches and renamed into place, which is atomic on one file system, so a consumer only
ever sees complete messages. ``controlplane.broker`` makes ``filesystem://`` use it.

An exchange's table of bindings has the same gap: kombu creates the file empty and only
then locks it and writes the first binding, so another process binding or publishing to
the same exchange at that moment reads an empty table and fails with ``JSONDecodeError``
(seen when two host agents started together). Here the first binding is written to a
private file and linked into place, which fails if another process made the table first;
the binding is then added to that table under kombu's lock, as kombu does.
"""

import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: ``_get`` matches ``<anything>.<queue>.msg`` after the first dot,
        # which this name never is.
        partial = os.path.join(self.data_folder_out, f".partial-{uuid.uuid4().hex}")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(exist_ok=True)
            binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            partial = self.control_folder / f".partial-{uuid.uuid4().hex}"
            try:
                partial.write_bytes(str_to_bytes(dumps([binding])))
                os.link(partial, table)  # never replaces: fails if the table exists
                return
            except FileExistsError:
                pass  # another process made the table first: add this binding to it below
            except OSError as exc:
                raise filesystem.ChannelError(f"Cannot open {table}") from exc
            finally:
                partial.unlink(missing_ok=True)
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel
