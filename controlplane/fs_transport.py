"""kombu's filesystem transport, with messages that appear whole.

kombu writes a message by creating its file in the queue folder and then writing into it,
while a consumer takes any file it sees: a consumer that looks between the two reads an
empty message, and the worker stops with ``JSONDecodeError`` (seen with Kumo's controller
under a burst of agent reports). Here a message is written under a name no consumer
matches and renamed into place, which is atomic on one file system, so a consumer only
ever sees complete messages. ``controlplane.broker`` makes ``filesystem://`` use it.
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


class Transport(filesystem.Transport):
    Channel = Channel
