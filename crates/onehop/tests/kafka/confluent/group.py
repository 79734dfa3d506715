"""confluent-kafka (Python, on librdkafka) roles for crates/onehop/tests/kafka/librdkafka.rs.

usage:
  python3 group.py consume BROKER TOPIC GROUP
      A member of GROUP: prints each value it receives ("V <value>"), then commits that
      message's offset synchronously, retrying while the server is away; SIGTERM closes it
      (LeaveGroup) and ends it.
  python3 group.py produce BROKER TOPIC FIRST COUNT
      An idempotent producer (acks=all) writing values FIRST..FIRST+COUNT; prints each
      acknowledgement ("A <partition> <offset> <value>") and retries across a server restart.
"""
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer


def consume(broker, topic, group):
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({"bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 10000,
                         "heartbeat.interval.ms": 1000})
    consumer.subscribe([topic])
    while not stopping:
        message = consumer.poll(0.2)
        if message is None or message.error() is not None:
            continue
        print(f"V {message.value().decode()}", flush=True)
        while not stopping:
            try:
                consumer.commit(message=message, asynchronous=False)
                break
            except KafkaException:
                time.sleep(0.2)
    consumer.close()


def produce(broker, topic, first, count):
    producer = Producer({"bootstrap.servers": broker, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 120000, "compression.codec": "lz4"})

    def delivered(error, message):
        if error is not None:
            print(f"F {error}", flush=True)
            return
        print(f"A {message.partition()} {message.offset()} {message.value().decode()}", flush=True)

    for i in range(first, first + count):
        while True:
            try:
                producer.produce(topic, key=f"k{i}", value=f"v{i}", on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        time.sleep(0.001)
    if producer.flush(120) != 0:
        sys.exit("records left unacknowledged")


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "consume":
        consume(*sys.argv[2:5])
    elif role == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(f"unknown role {role}")
