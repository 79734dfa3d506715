"""A static member of a consumer group (confluent-kafka, on librdkafka), for
crates/onehop/tests/kafka/groups.rs.

usage: python3 static_member.py BROKER TOPIC GROUP INSTANCE

Joins GROUP with group.instance.id INSTANCE (the eager range assignor, so that a rebalance
revokes every partition first) and consumes TOPIC until killed, printing one JSON line per
event, flushed at once: {"event": "assign" | "revoke", "partitions": [...]} and
{"event": "record", "partition": P, "offset": O}.
"""
import json
import sys

from confluent_kafka import Consumer


def say(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


def main():
    broker, topic, group, instance = sys.argv[1:5]
    consumer = Consumer({
        "bootstrap.servers": broker,
        "group.id": group,
        "group.instance.id": instance,
        "partition.assignment.strategy": "range",
        # Long enough that the member killed is still in the group when it comes back, and that
        # a rebalance waiting for it would not end before the test gives up.
        "session.timeout.ms": 120000,
        "max.poll.interval.ms": 300000,
        "heartbeat.interval.ms": 500,
        "auto.offset.reset": "earliest",
    })
    consumer.subscribe(
        [topic],
        on_assign=lambda _, partitions: say("assign", partitions=sorted(p.partition for p in partitions)),
        on_revoke=lambda _, partitions: say("revoke", partitions=sorted(p.partition for p in partitions)),
    )
    while True:
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        say("record", partition=message.partition(), offset=message.offset())


if __name__ == "__main__":
    main()
