"""Kumo's Redis transport (``controlplane.redis_transport``) on a real Redis: one synchronous
client per channel and pool, and the messages taken and acknowledged through it."""

import os

import pytest
from kombu import Connection, Exchange, Queue

import controlplane.broker  # noqa: F401  (maps redis:// to Kumo's transport)
from controlplane import redis_transport

REDIS_URL = os.environ.get("KUMO_TEST_REDIS_URL")

pytestmark = pytest.mark.skipif(not REDIS_URL, reason="no Redis: KUMO_TEST_REDIS_URL unset")


@pytest.fixture
def channel():
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    with Connection(REDIS_URL) as connection:
        channel = connection.default_channel
        assert isinstance(channel, redis_transport.Channel)
        yield channel


def test_a_channel_keeps_one_synchronous_client_per_pool(channel):
    first = channel._create_client()
    assert channel._create_client() is first
    assert channel._create_client(asynchronous=True) is not first  # the consumer's own
    channel._disconnect_pools()  # as after a lost connection: a new pool, a new client
    second = channel._create_client()
    assert second is not first and second.connection_pool is channel.pool


def test_messages_taken_and_acknowledged_through_the_shared_client(channel):
    queue = Queue("kumo-transport-test", Exchange("kumo-transport-test"), "t")
    with channel.connection.client as connection:
        producer = connection.Producer()
        for n in range(5):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="t", declare=[queue])
        taken = []
        with connection.Consumer(queue, callbacks=[lambda *got: taken.append(got)]) as consumer:
            consumer.qos(prefetch_count=5)
            while len(taken) < 5:
                connection.drain_events(timeout=5)
            qos = consumer.channel.qos
            client = consumer.channel._create_client()
            assert client.hlen(qos.unacked_key) == 5  # held while unacknowledged
            for _body, message in taken:
                message.ack()
            assert client.hlen(qos.unacked_key) == 0
    assert [body["n"] for body, _message in taken] == list(range(5))
