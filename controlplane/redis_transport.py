"""Kombu's Redis transport, made to survive the broker's restart with a message in flight,
and to build one synchronous Redis client per channel instead of one per command
(``Channel._create_client``).

Every Kumo process talks to Redis through this transport (``controlplane.broker`` maps the
``redis://`` scheme to it), the controller and the Django-free agent alike.

The defect it removes (kombu 5.7.0, ``kombu/transport/redis.py``): when the connection to
Redis is lost, Celery's consumer closes the old ``kombu.Connection`` (``Connection._close``
sets the transport's ``client`` to None and the channels drop their connection pools) and
opens a new one. A task that was running meanwhile is late-acknowledged (``acks_late``)
when it ends, on the *old* channel: ``QoS.ack`` → ``Channel.conn_or_acquire`` →
``Channel.pool`` → ``Channel._connparams`` reads ``self.connection.client.hostname`` and
raises ``AttributeError: 'NoneType' object has no attribute 'hostname'``. Celery's
``Message.ack_log_error`` catches only the transport's connection and channel errors, so
the AttributeError escapes into the worker's event loop: "Unrecoverable error", and the
worker exits. No worker setting avoids it (``broker_connection_retry*`` govern reconnects,
which work; ``worker_cancel_long_running_tasks_on_connection_loss`` cancels running late-ack
tasks on the prefork pool only and is ignored by the threads pool the controller uses; the
visibility timeout, health checks and keep-alives only change when the loss is noticed).

Here a channel whose connection was closed answers as a lost connection does: an ack or a
reject on it is dropped with one log line (the message is no longer held by this consumer:
Redis either still has it in its unacked set, which it delivers again after the visibility
timeout, or lost it with its data; every Kumo task is idempotent and the reconcile re-issues
whatever the database still wants), and anything else raises a ``ConnectionError`` that
Celery already knows how to handle.
"""

import logging

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)


def _closed(channel) -> bool:
    transport = getattr(channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


class QoS(kombu_redis.QoS):
    def ack(self, delivery_tag):
        if _closed(self.channel):
            self._forget(delivery_tag, "acknowledged")
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        if _closed(self.channel):
            self._forget(delivery_tag, "rejected")
            return
        super().reject(delivery_tag, requeue=requeue)

    def _forget(self, delivery_tag, verb: str) -> None:
        self._delivered.pop(delivery_tag, None)
        log.warning(
            "message %s not %s: the broker connection it came on was lost meanwhile "
            "(the broker delivers it again or lost it; its work is idempotent)",
            delivery_tag,
            verb,
        )


class Channel(kombu_redis.Channel):
    QoS = QoS

    def _create_client(self, asynchronous=False):
        """A client of the channel's pool. Kombu builds a new ``redis.Redis`` each time it
        sends a command outside the consumer's own connection: twice for every message a
        worker takes (the delivery's bookkeeping and its ack), and building one cost a
        controller more of its CPU than the commands' own Python. A synchronous client holds
        nothing but its pool (each command takes a connection from it and gives it back, so
        threads may share it), so one per pool serves them all; a new pool (after a lost
        connection) gets a new client. The asynchronous ones are built each time, as before:
        the consumer keeps a connection on its client (BRPOP)."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool  # a closed channel raises here, as before (``_connparams``)
        client = self.__dict__.get("_sync_client")
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _connparams(self, asynchronous=False):
        if _closed(self):
            raise RedisConnectionError("the broker connection of this channel was closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
