"""confluent-kafka (Python, on librdkafka) against onehop's Kafka listener, for
crates/onehop/tests/kafka/librdkafka.rs.

usage: python3 client.py BROKER TOPIC GROUP

Creates TOPIC (3 partitions) with the admin client; an idempotent producer (acks=all) writes 40
keyed records with a header under each codec (none, gzip, snappy, lz4, zstd); a transactional
producer commits 5 records and aborts 3; a read_committed consumer in GROUP reads everything
from the beginning and commits. Prints one JSON line: what was acknowledged, what was read, the
committed offsets, and librdkafka's version.
"""
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition, libversion
from confluent_kafka.admin import AdminClient, NewTopic


def main():
    broker, topic, group = sys.argv[1:4]
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([NewTopic(topic, num_partitions=3)]).values():
        future.result(timeout=30)

    acked = []

    def delivered(error, message):
        if error is not None:
            raise KafkaException(error)
        acked.append([message.partition(), message.offset(), message.value().decode()])

    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        producer = Producer({"bootstrap.servers": broker, "enable.idempotence": True, "acks": "all",
                             "compression.codec": codec, "linger.ms": 5})
        for i in range(40):
            producer.produce(topic, key=f"key-{i}", value=f"{codec}-{i}", headers=[("codec", codec.encode())],
                             on_delivery=delivered)
        if producer.flush(30) != 0:
            raise RuntimeError(f"{codec}: records left unsent")

    transactional = Producer({"bootstrap.servers": broker, "transactional.id": "confluent-txn"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(5):
        transactional.produce(topic, key=f"t-{i}", value=f"committed-{i}")
    transactional.commit_transaction(30)
    transactional.begin_transaction()
    for i in range(3):
        transactional.produce(topic, key=f"a-{i}", value=f"aborted-{i}")
    transactional.flush(30)
    transactional.abort_transaction(30)

    consumer = Consumer({"bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    read, headers = [], 0
    deadline = time.time() + 30
    while len(read) < 205 and time.time() < deadline:
        message = consumer.poll(1.0)
        if message is None or message.error() is not None:
            continue
        read.append(message.value().decode())
        headers += any(name == "codec" for name, _ in (message.headers() or []))
    # Anything more (an aborted record) would arrive now.
    end = time.time() + 2
    while time.time() < end:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append(message.value().decode())
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    consumer.close()
    print(json.dumps({
        "acked": acked,
        "read": read,
        "headers": headers,
        "committed": sum(tp.offset for tp in committed),
        "librdkafka": libversion()[0],
    }))


if __name__ == "__main__":
    main()
