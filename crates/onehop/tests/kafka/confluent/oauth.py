"""confluent-kafka (Python, on librdkafka) logging in with SASL OAUTHBEARER, for
crates/onehop/tests/kafka/sasl.rs. Its token callback signs a fresh HS256 JWT with Python's own
hmac each time librdkafka asks, so the token is made by another implementation than the one
checking it.

usage:
  python3 oauth.py BROKER TOPIC SECRET_HEX LIFETIME_S SECONDS [forged]
      Produces one message every 100 ms for SECONDS with acks=all, as user "device-9" with role
      "devices", each token valid for LIFETIME_S; then consumes the topic from the start.
      Prints one JSON line: acknowledged and consumed values, tokens made, errors seen.
      With "forged", signs with another secret and reports the error it gets.

The server accepts a token for 30 s past its `exp` (clock skew), so a token whose `exp` is
30 s − LIFETIME_S ago is valid for LIFETIME_S more: that makes sessions short enough for the
client to log in again (KIP-368) several times within a short test. librdkafka logs in again at
90 % of the session the server announced, with the newest token it holds.
"""
import base64
import hashlib
import hmac
import json
import sys
import time

from confluent_kafka import Consumer, Producer

LEEWAY_S = 30


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main():
    broker, topic, secret_hex, lifetime, seconds = sys.argv[1:6]
    forged = len(sys.argv) > 6 and sys.argv[6] == "forged"
    secret = bytes.fromhex(secret_hex)
    if forged:
        secret = hashlib.sha256(secret).digest()
    lifetime, seconds = float(lifetime), float(seconds)
    tokens = []
    errors = []

    def token(_config):
        now = time.time()
        header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "hmac1"}).encode())
        claims = b64url(json.dumps({"sub": "device-9", "roles": ["devices"], "iat": int(now),
                                    "exp": now + lifetime - LEEWAY_S}).encode())
        signature = hmac.new(secret, f"{header}.{claims}".encode(), hashlib.sha256).digest()
        tokens.append(now)
        # librdkafka is told the token lasts half its life, so it fetches the next one well
        # before the server's session ends (its refresh timer ticks once a second), as real
        # clients refresh minutes ahead.
        return f"{header}.{claims}.{b64url(signature)}", now + lifetime / 2

    common = {"bootstrap.servers": broker, "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": token,
              "error_cb": lambda error: errors.append(str(error))}
    producer = Producer({**common, "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000})
    acked = []

    def delivered(error, message):
        if error is not None:
            errors.append(str(error))
        else:
            acked.append(message.value().decode())

    if forged:
        producer.produce(topic, b"forged", on_delivery=delivered)
        deadline = time.time() + 10
        while not errors and time.time() < deadline:
            producer.poll(0.1)
        print(json.dumps({"acked": acked, "errors": errors}), flush=True)
        return
    end = time.time() + seconds
    sent = 0
    while time.time() < end:
        producer.produce(topic, f"m{sent}".encode(), on_delivery=delivered)
        sent += 1
        producer.poll(0.1)
    producer.flush(30)

    consumer = Consumer({**common, "group.id": "oauth-readers", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    consumed = []
    deadline = time.time() + 30
    while len(consumed) < len(acked) and time.time() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            consumed.append(message.value().decode())
    consumer.close()
    print(json.dumps({"sent": sent, "acked": acked, "consumed": consumed, "tokens": len(tokens),
                      "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
