"""Reads one partition of a topic from its start to its end with confluent-kafka's
read_committed consumer, for tests that check what a stream holds as Kafka clients see it
(crates/onehop/tests/views.rs: a view's change stream across kill -9).

usage: python3 read_committed.py BROKER TOPIC

Prints one JSON line per record: {"offset", "key", "value"} (key and value as UTF-8 text).
"""
import json
import sys
import time

from confluent_kafka import Consumer, TopicPartition


def main():
    broker, topic = sys.argv[1:3]
    consumer = Consumer({"bootstrap.servers": broker, "group.id": "read-committed-check",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.assign([TopicPartition(topic, 0, 0)])
    offset = 0
    deadline = time.time() + 60
    while offset < end:
        if time.time() > deadline:
            raise RuntimeError(f"read {offset} of {end} records of {topic} in 60 s")
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error() is not None:
            raise RuntimeError(str(message.error()))
        offset = message.offset() + 1
        key = message.key().decode() if message.key() is not None else None
        value = message.value().decode() if message.value() is not None else None
        print(json.dumps({"offset": message.offset(), "key": key, "value": value}), flush=True)
    consumer.close()


if __name__ == "__main__":
    main()
