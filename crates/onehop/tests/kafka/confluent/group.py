"""confluent-kafka (Python, on librdkafka) roles for crates/onehop/tests/kafka/librdkafka.rs and
crates/onehop/tests/cluster.rs.

usage:
  python3 group.py consume BROKER TOPIC GROUP
      A member of GROUP: prints each value it receives ("V <value>"), then commits that
      message's offset synchronously, retrying while the server is away; SIGTERM closes it
      (LeaveGroup) and ends it.
  python3 group.py produce BROKER TOPIC FIRST COUNT
      An idempotent producer (acks=all) writing values FIRST..FIRST+COUNT; prints each
      acknowledgement ("A <partition> <offset> <value>") and retries across a server restart.
  python3 group.py transactions BROKER TOPIC COUNT SIZE
      A transactional producer writing COUNT transactions of SIZE records each ("t<n>-<k>");
      prints "C <n>" once transaction n is committed and "X <n>" once it is aborted (when the
      client says it must be), retrying a commit or an abort the client says may be retried.
"""
import os
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


def transactions(broker, topic, count, size):
    config = {"bootstrap.servers": broker, "transactional.id": f"{topic}-writer", "acks": "all",
              "linger.ms": 5, "transaction.timeout.ms": 60000, "message.timeout.ms": 60000}
    if os.environ.get("RDKAFKA_DEBUG"):
        config["debug"] = os.environ["RDKAFKA_DEBUG"]
    producer = Producer(config)
    producer.init_transactions(120)

    def finish(action):
        # Retries what the client says may be retried; a fatal error ends the run.
        while True:
            try:
                action(60)
                return True
            except KafkaException as error:
                if error.args[0].retriable():
                    time.sleep(0.1)
                    continue
                if error.args[0].txn_requires_abort():
                    return False
                raise

    for n in range(count):
        producer.begin_transaction()
        for k in range(size):
            while True:
                try:
                    producer.produce(topic, key=f"t{n}", value=f"t{n}-{k}")
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        if finish(producer.commit_transaction):
            print(f"C {n}", flush=True)
        elif finish(producer.abort_transaction):
            print(f"X {n}", flush=True)
        else:
            sys.exit(f"transaction {n} could be neither committed nor aborted")


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "consume":
        consume(*sys.argv[2:5])
    elif role == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif role == "transactions":
        transactions(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(f"unknown role {role}")
