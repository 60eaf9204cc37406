"""What the seed scripts share: creating a topic once, and producing with delivery checks."""

from __future__ import annotations

import sys

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def new_topic(bootstrap: str, topic: str, partitions: int) -> bool:
    """Create `topic`; False when it exists already (left as it is)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" in str(e) or "already exists" in str(e):
            print(f"topic {topic} exists already on {bootstrap}: left as it is")
            return False
        raise
    return True


class Sender:
    """A producer that remembers delivery errors."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
        self.errors: list[str] = []

    def _done(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def send(self, topic: str, key: bytes, value: bytes, **kw) -> None:
        self.producer.produce(topic, key=key, value=value, on_delivery=self._done, **kw)
        self.producer.poll(0)

    def finish(self, topic: str, done: str) -> int:
        """Wait for every record; print `done`, or what went wrong. The exit status."""
        left = self.producer.flush(60)
        if left or self.errors:
            print(f"producing to {topic} failed: {left} undelivered, errors {self.errors[:3]}", file=sys.stderr)
            return 1
        print(done)
        return 0
