"""Independent MQTT client checks against onehop, with paho-mqtt (PyPI). Called by
crates/onehop/tests/mqtt.rs with a port and a scenario; prints one JSON line per fact the Rust
test asserts on, or "acked <payload>" lines for the publisher scenario. Exits non-zero on a
failed expectation, with the reason on stderr."""

import json
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

HOST = "127.0.0.1"


def fail(reason):
    print(reason, file=sys.stderr)
    sys.exit(1)


def client(client_id, protocol=mqtt.MQTTv311, **kwargs):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)
    return c


class Inbox:
    """Collects messages; wait(n) blocks until n arrived or times out."""

    def __init__(self):
        self.messages = []
        self.cond = threading.Condition()

    def on_message(self, _client, _userdata, message):
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait(self, count, timeout=10.0):
        deadline = time.time() + timeout
        with self.cond:
            while len(self.messages) < count:
                left = deadline - time.time()
                if left <= 0:
                    fail(f"expected {count} messages, got {len(self.messages)}: "
                         f"{[(m.topic, m.payload) for m in self.messages]}")
                self.cond.wait(left)
        return self.messages


def connected(c, port, **kwargs):
    ready = threading.Event()
    result = {}

    def on_connect(_client, _userdata, flags, reason_code, properties):
        result["rc"] = reason_code
        result["properties"] = properties
        result["flags"] = flags
        ready.set()

    c.on_connect = on_connect
    c.connect(HOST, port, **kwargs)
    c.loop_start()
    if not ready.wait(10):
        fail("no CONNACK within 10 s")
    if result["rc"].is_failure:
        fail(f"connect refused: {result['rc']}")
    return result


def subscribed(c, topic, qos=None, **kwargs):
    done = threading.Event()
    granted = {}

    def on_subscribe(_client, _userdata, mid, reason_codes, properties):
        granted["codes"] = reason_codes
        done.set()

    c.on_subscribe = on_subscribe
    if qos is None:
        c.subscribe(topic, **kwargs)
    else:
        c.subscribe(topic, qos, **kwargs)
    if not done.wait(10):
        fail(f"no SUBACK for {topic}")
    return granted["codes"]


def listening(c, port, topic, qos=1, **kwargs):
    """Connects `c` and subscribes it to `topic`, collecting what it receives; returns the Inbox
    and the SUBACK's reason codes."""
    inbox = Inbox()
    c.on_message = inbox.on_message
    connected(c, port)
    return inbox, subscribed(c, topic, qos, **kwargs)


def qos_round_trips(port):
    """QoS 0, 1 and 2 each way, v3.1.1 and v5, exactly-once for QoS 2."""
    for protocol, name in ((mqtt.MQTTv311, "v311"), (mqtt.MQTTv5, "v5")):
        sub = client(f"paho-sub-{name}", protocol)
        inbox, codes = listening(sub, port, f"paho/{name}/#", 2)
        print(json.dumps({"check": "suback", "protocol": name, "granted": [c.value for c in codes]}))
        pub = client(f"paho-pub-{name}", protocol)
        connected(pub, port)
        for qos in (0, 1, 2):
            info = pub.publish(f"paho/{name}/q{qos}", f"qos{qos}", qos=qos)
            info.wait_for_publish(10)
            if not info.is_published():
                fail(f"{name} QoS {qos} publish not acknowledged")
        messages = inbox.wait(3)
        time.sleep(0.3)  # a duplicate would arrive meanwhile
        got = sorted((m.topic, m.payload.decode(), m.qos) for m in inbox.messages)
        print(json.dumps({"check": "round_trip", "protocol": name, "messages": got}))
        pub.disconnect()
        sub.disconnect()
        pub.loop_stop()
        sub.loop_stop()


def v5_features(port):
    """User properties, subscription identifiers, topic aliases, message expiry, assigned ids."""
    inbox = Inbox()
    sub = client("", mqtt.MQTTv5)
    sub.on_message = inbox.on_message
    result = connected(sub, port, clean_start=True)
    assigned = getattr(result["properties"], "AssignedClientIdentifier", None)
    print(json.dumps({"check": "assigned_id", "id": assigned}))
    props = Properties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 7
    subscribed(sub, "v5/things/+", 1, properties=props)
    pub = client("v5-pub", mqtt.MQTTv5)
    connected(pub, port)
    publish_props = Properties(PacketTypes.PUBLISH)
    publish_props.UserProperty = [("unit", "celsius"), ("site", "oslo")]
    publish_props.MessageExpiryInterval = 60
    pub.publish("v5/things/a", "with properties", qos=1, properties=publish_props).wait_for_publish(10)
    alias_props = Properties(PacketTypes.PUBLISH)
    alias_props.TopicAlias = 3
    pub.publish("v5/things/b", "sets alias", qos=1, properties=alias_props).wait_for_publish(10)
    pub.publish("", "uses alias", qos=1, properties=alias_props).wait_for_publish(10)
    messages = inbox.wait(3)
    first = messages[0]
    print(json.dumps({
        "check": "v5_properties",
        "user_properties": sorted(getattr(first.properties, "UserProperty", [])),
        "subscription_ids": getattr(first.properties, "SubscriptionIdentifier", None),
        "expiry": getattr(first.properties, "MessageExpiryInterval", None),
        "topics": [m.topic for m in messages],
        "payloads": [m.payload.decode() for m in messages],
    }))
    pub.disconnect()
    sub.disconnect()


def with_will(client_id, topic, payload, port, **kwargs):
    """A 3.1.1 client connected to `port` whose will is `payload` on `topic`, at QoS 1."""
    c = client(client_id)
    c.will_set(topic, payload, qos=1)
    connected(c, port, **kwargs)
    return c


def will_and_takeover(port):
    """A will is sent when a client vanishes; a second connection with an id takes it over."""
    watcher = client("will-watcher")
    inbox, _ = listening(watcher, port, "status/+")
    doomed = with_will("doomed", "status/doomed", "gone", port)
    doomed.loop_stop()
    doomed.socket().close()  # vanish without DISCONNECT
    messages = inbox.wait(1)
    print(json.dumps({"check": "will", "topic": messages[0].topic, "payload": messages[0].payload.decode()}))
    polite = with_will("polite", "status/polite", "should not appear", port)
    polite.disconnect()
    polite.loop_stop()
    # Takeover: the first connection of "twin" is closed when the second arrives.
    first = client("twin")
    closed = threading.Event()
    first.on_disconnect = lambda *args: closed.set()
    connected(first, port)
    second = client("twin")
    connected(second, port)
    print(json.dumps({"check": "takeover", "first_closed": closed.wait(5)}))
    time.sleep(0.5)
    print(json.dumps({"check": "wills_seen", "topics": sorted(m.topic for m in inbox.messages)}))
    second.disconnect()
    watcher.disconnect()


def keep_alive(port):
    """A client that stops talking is dropped after 1.5 times its keep-alive, and its will is sent."""
    watcher = client("ka-watcher")
    inbox, _ = listening(watcher, port, "status/+")
    silent = with_will("silent", "status/silent", "timed out", port, keepalive=1)
    silent.loop_stop()  # no more PINGREQ
    started = time.time()
    messages = inbox.wait(1, timeout=10)
    print(json.dumps({"check": "keep_alive", "topic": messages[0].topic,
                      "seconds": round(time.time() - started, 2)}))
    watcher.disconnect()


def websocket(http_port, tcp_port):
    """MQTT over WebSocket (/mqtt on the HTTP port) and over TCP see each other's messages."""
    ws = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ws-client", protocol=mqtt.MQTTv5,
                     transport="websockets")
    ws.ws_set_options(path="/mqtt")
    inbox, _ = listening(ws, http_port, "web/+")
    tcp = client("tcp-client")
    tcp_inbox, _ = listening(tcp, tcp_port, "web/#")
    tcp.publish("web/from-tcp", "hello browser", qos=1).wait_for_publish(10)
    ws.publish("web/from-ws", "hello device", qos=1).wait_for_publish(10)
    got = sorted((m.topic, m.payload.decode()) for m in inbox.wait(2))
    tcp_got = sorted((m.topic, m.payload.decode()) for m in tcp_inbox.wait(2))
    print(json.dumps({"check": "websocket", "ws_got": got, "tcp_got": tcp_got}))
    ws.disconnect()
    tcp.disconnect()


def shared(port):
    """$share/workers/jobs/#: each message to exactly one member; a plain subscriber gets all."""
    inboxes = []
    members = []
    for i, protocol in enumerate((mqtt.MQTTv311, mqtt.MQTTv5)):
        member = client(f"worker-{i}", protocol)
        inbox, codes = listening(member, port, "$share/workers/jobs/#")
        if codes[0].is_failure:
            fail(f"shared subscription refused: {codes}")
        inboxes.append(inbox)
        members.append(member)
    watcher = client("jobs-watcher")
    watcher_inbox, _ = listening(watcher, port, "jobs/#")
    pub = client("jobs-publisher")
    connected(pub, port)
    for i in range(40):
        pub.publish(f"jobs/{i % 4}", f"job{i}", qos=1).wait_for_publish(10)
    watcher_inbox.wait(40)
    deadline = time.time() + 10
    while sum(len(inbox.messages) for inbox in inboxes) < 40 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a duplicate would arrive meanwhile
    print(json.dumps({
        "check": "shared",
        "per_member": [len(inbox.messages) for inbox in inboxes],
        "payloads": sorted(m.payload.decode() for inbox in inboxes for m in inbox.messages),
        "watcher": len(watcher_inbox.messages),
    }))
    # When one member leaves, the other gets everything.
    members[0].disconnect()
    members[0].loop_stop()
    time.sleep(0.3)
    before = len(inboxes[1].messages)
    for i in range(10):
        pub.publish("jobs/after", f"late{i}", qos=1).wait_for_publish(10)
    inboxes[1].wait(before + 10)
    print(json.dumps({"check": "shared_after_leave", "got": len(inboxes[1].messages) - before}))
    for c in (members[1], watcher, pub):
        c.disconnect()


def persistent(port, client_id, protocol_name, inbox=None):
    """Connects to a persistent session (3.1.1 clean_session=0, or 5.0 with an expiry)."""
    if protocol_name == "v5":
        c = client(client_id, mqtt.MQTTv5)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        connect_args = {"clean_start": False, "properties": props}
    else:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                        clean_session=False)
        connect_args = {}
    if inbox is not None:
        c.on_message = inbox.on_message
    return c, connected(c, port, **connect_args)


def session_subscribe(port, client_id, protocol_name):
    """A persistent session subscribes to inbox/#, then disconnects."""
    c, result = persistent(port, client_id, protocol_name)
    subscribed(c, "inbox/#", 1)
    print(json.dumps({"check": "session_subscribed", "present": bool(result["flags"].session_present)}))
    c.disconnect()
    c.loop_stop()


def session_clean(port, client_id):
    """Connects with a clean session (which ends any stored one) and leaves."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, clean_session=True)
    result = connected(c, port)
    print(json.dumps({"check": "session_clean", "present": bool(result["flags"].session_present)}))
    c.disconnect()
    c.loop_stop()


def session_unacked(port):
    """A persistent session receives 4 QoS 1 messages without acknowledging them and leaves;
    back again, it gets the same 4, flagged DUP, and acknowledges them."""
    inbox = Inbox()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="forgetful", protocol=mqtt.MQTTv311,
                    clean_session=False, manual_ack=True)
    c.on_message = inbox.on_message
    connected(c, port)
    subscribed(c, "chores/#", 1)
    pub = client("chores-publisher")
    connected(pub, port)
    for i in range(4):
        pub.publish("chores/today", f"chore{i}", qos=1).wait_for_publish(10)
    first = inbox.wait(4)
    first_dup = [bool(m.dup) for m in first]
    c.disconnect()
    c.loop_stop()
    again = Inbox()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="forgetful", protocol=mqtt.MQTTv311,
                    clean_session=False)
    c.on_message = again.on_message
    result = connected(c, port)
    second = again.wait(4)
    time.sleep(0.3)
    print(json.dumps({
        "check": "unacked",
        "present": bool(result["flags"].session_present),
        "first_dup": first_dup,
        "second": sorted((m.payload.decode(), bool(m.dup)) for m in again.messages),
    }))
    c.disconnect()
    pub.disconnect()


def session_publish(port, count):
    """QoS 1 messages to inbox/…, each acknowledged."""
    c = client("inbox-publisher")
    connected(c, port)
    for i in range(count):
        c.publish(f"inbox/{i % 3}", f"msg{i}", qos=1).wait_for_publish(10)
    print(json.dumps({"check": "session_published", "count": count}))
    c.disconnect()


def session_resume(port, client_id, protocol_name, count):
    """Reconnects to the session: it is present, and every message sent meanwhile arrives."""
    inbox = Inbox()
    c, result = persistent(port, client_id, protocol_name, inbox)
    present = bool(result["flags"].session_present)
    if count > 0:
        inbox.wait(count)
    time.sleep(0.3)
    print(json.dumps({"check": "session_resumed", "present": present,
                      "payloads": sorted(m.payload.decode() for m in inbox.messages)}))
    c.disconnect()
    c.loop_stop()


def exactly_once_crash(port, count):
    """A persistent QoS 2 publisher and a persistent QoS 2 subscriber while the server is killed
    (the test does it on our "kill_me" line and answers with the new server's port): after both
    reconnect, every message has arrived exactly once."""
    sub = client("exact-sub", clean_session=False)
    inbox, _ = listening(sub, port, "exact/#", 2)
    pub = client("exact-pub", clean_session=False)
    pub.max_inflight_messages_set(20)
    # paho resets its in-flight messages on every reconnect attempt, and a second reset turns a
    # QoS 2 message it already had PUBREC for back into a new PUBLISH (a client bug no broker
    # can undo). Reconnect once, ourselves, when the server is back.
    for c in (sub, pub):
        c.reconnect_delay_set(min_delay=120, max_delay=120)
    connected(pub, port)
    infos = [pub.publish("exact/m", f"e{i}", qos=2) for i in range(count)]
    inbox.wait(count // 4, timeout=20)
    print(json.dumps({"check": "kill_me"}), flush=True)
    new_port = int(sys.stdin.readline())
    for c in (sub, pub):
        # Same clients, same in-flight state: only the address changed.
        c.loop_stop()
        result = connected(c, new_port)
        if not result["flags"].session_present:
            fail("the session did not survive the kill")
    inbox.wait(count, timeout=30)
    for info in infos:
        info.wait_for_publish(10)
    time.sleep(1.0)  # a duplicate would arrive by now
    print(json.dumps({"check": "exactly_once", "payloads": [m.payload.decode() for m in inbox.messages]}))
    for c in (sub, pub):
        c.disconnect()
        c.loop_stop()


def v5_more(port):
    """no local, will delay (not sent when the client is back in time), and a DISCONNECT that
    ends a persistent session."""
    from paho.mqtt.subscribeoptions import SubscribeOptions
    talker = client("talker", mqtt.MQTTv5)
    inbox, _ = listening(talker, port, "chat/#", None, options=SubscribeOptions(qos=1, noLocal=True))
    talker.publish("chat/mine", "from me", qos=1).wait_for_publish(10)
    other = client("other", mqtt.MQTTv5)
    connected(other, port)
    other.publish("chat/theirs", "from them", qos=1).wait_for_publish(10)
    inbox.wait(1)
    time.sleep(0.3)
    print(json.dumps({"check": "no_local", "topics": [m.topic for m in inbox.messages]}))

    watcher = client("delay-watcher", mqtt.MQTTv5)
    wills, _ = listening(watcher, port, "gone/+")

    def vanishing(client_id, delay):
        c = client(client_id, mqtt.MQTTv5)
        will_props = Properties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = delay
        c.will_set(f"gone/{client_id}", "bye", qos=1, properties=will_props)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 60
        connected(c, port, clean_start=False, properties=props)
        c.loop_stop()
        c.socket().close()

    vanishing("returns", 2)
    time.sleep(0.5)
    back = client("returns", mqtt.MQTTv5)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 60
    connected(back, port, clean_start=False, properties=props)
    vanishing("stays-away", 1)
    wills.wait(1, timeout=10)
    time.sleep(2.5)  # the returning client's will would be due by now
    print(json.dumps({"check": "will_delay", "topics": sorted(m.topic for m in wills.messages)}))

    # DISCONNECT with a session expiry of 0 ends the stored session.
    end_props = Properties(PacketTypes.DISCONNECT)
    end_props.SessionExpiryInterval = 0
    back.disconnect(properties=end_props)
    back.loop_stop()
    again = client("returns", mqtt.MQTTv5)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 60
    result = connected(again, port, clean_start=False, properties=props)
    print(json.dumps({"check": "session_ended", "present": bool(result["flags"].session_present)}))
    for c in (again, watcher, other, talker):
        c.disconnect()


def routes_follow_the_catalog(port, http_port):
    """One connection publishes to the same topics while streams, tables and views are created
    and dropped over HTTP: each PUBACK must say what the catalog says at that moment."""
    import urllib.error
    import urllib.request

    def sql(statement):
        request = urllib.request.Request(f"http://{HOST}:{http_port}/sql", data=statement.encode(), method="POST")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as error:
            fail(f"{statement}: HTTP {error.code} {error.read().decode()}")

    codes = {}
    acked = threading.Condition()

    def on_publish(_client, _userdata, mid, reason_code, _properties):
        with acked:
            codes[mid] = reason_code.value
            acked.notify_all()

    c = client("router", mqtt.MQTTv5)
    c.on_publish = on_publish
    connected(c, port)

    def publish(step, topic, payload):
        info = c.publish(topic, payload, qos=1)
        with acked:
            if not acked.wait_for(lambda: info.mid in codes, timeout=10):
                fail(f"{step}: no PUBACK")
        print(json.dumps({"check": "route", "step": step, "code": codes[info.mid]}))

    publish("new_stream", "gadgets/a", "1")
    publish("again", "gadgets/a", "2")
    sql("DROP STREAM gadgets")
    publish("stream_dropped", "gadgets/a", "3")
    sql("CREATE STREAM gz WITH (mqtt_topic = 'gizmos/#')")
    publish("routed_stream", "gizmos/a", "4")
    sql("CREATE TABLE gizmos (id TEXT PRIMARY KEY)")
    publish("table_created", "gizmos/a", "5")
    sql("DROP TABLE gizmos")
    publish("table_dropped", "gizmos/a", "6")
    publish("before_view", "views/counts/a", "7")
    # Again: the first one created a stream, so only now is the route remembered unchanged.
    publish("before_view_again", "views/counts/a", "7")
    sql("CREATE VIEW counts AS SELECT COUNT(*) AS n FROM gadgets GROUP BY 'all'")
    publish("view_created", "views/counts/a", "8")
    c.disconnect()


def message_properties(port, http_port):
    """Payload format, content type, response topic and correlation data as subscribers get
    them: live, retained, to a persistent session that was away, and from an HTTP publish that
    set them as record headers."""
    import urllib.request

    def facts(via, message):
        props = message.properties
        correlation = getattr(props, "CorrelationData", None)
        print(json.dumps({
            "check": "properties",
            "via": via,
            "topic": message.topic,
            "format": getattr(props, "PayloadFormatIndicator", None),
            "content_type": getattr(props, "ContentType", None),
            "response_topic": getattr(props, "ResponseTopic", None),
            "correlation_hex": correlation.hex() if correlation is not None else None,
            "user_properties": sorted(getattr(props, "UserProperty", [])),
        }))

    keeper, _ = persistent(port, "rpc-keeper", "v5")
    subscribed(keeper, "rpc/#", 1)
    keeper.disconnect()
    keeper.loop_stop()

    listener = client("rpc-live", mqtt.MQTTv5)
    live, _ = listening(listener, port, "rpc/requests/#")

    caller = client("rpc-caller", mqtt.MQTTv5)
    connected(caller, port)
    props = Properties(PacketTypes.PUBLISH)
    props.PayloadFormatIndicator = 1
    props.ContentType = "application/json"
    props.ResponseTopic = "rpc/replies/caller-7"
    props.CorrelationData = b"\x00req42-\xff"
    props.UserProperty = [("trace", "t-1")]
    caller.publish("rpc/requests/add", '{"a":1}', qos=1, retain=True, properties=props).wait_for_publish(10)
    facts("live", live.wait(1)[0])

    newcomer = client("rpc-late", mqtt.MQTTv5)
    late, _ = listening(newcomer, port, "rpc/requests/#")
    facts("retained", late.wait(1)[0])

    away = Inbox()
    keeper, result = persistent(port, "rpc-keeper", "v5", away)
    if not result["flags"].session_present:
        fail("the session was not kept")
    facts("session", away.wait(1)[0])

    envelope = {"subject": "rpc/requests/http", "value": {"b": 2}, "headers": {
        "onehop-mqtt-response-topic": "rpc/replies/http",
        "onehop-mqtt-correlation-data": "from-http",
        "onehop-mqtt-content-type": "text/plain",
    }}
    request = urllib.request.Request(f"http://{HOST}:{http_port}/streams/rpc", method="POST",
                                     data=(json.dumps(envelope) + "\n").encode(),
                                     headers={"content-type": "application/x-ndjson"})
    urllib.request.urlopen(request, timeout=10).close()
    facts("http", live.wait(2)[1])
    for c in (keeper, newcomer, caller, listener):
        c.disconnect()


def publisher(port, topic, count):
    """QoS 1 publishes one after another; prints each payload once PUBACKed."""
    c = client("kill-publisher")
    connected(c, port)
    for i in range(count):
        payload = f"m{i}"
        info = c.publish(topic, payload, qos=1)
        try:
            info.wait_for_publish(5)
        except Exception:  # the server died
            break
        if not info.is_published():
            break
        print(f"acked {payload}", flush=True)


if __name__ == "__main__":
    port = int(sys.argv[1])
    scenario = sys.argv[2]
    if scenario == "qos":
        qos_round_trips(port)
    elif scenario == "v5":
        v5_features(port)
    elif scenario == "will":
        will_and_takeover(port)
    elif scenario == "keepalive":
        keep_alive(port)
    elif scenario == "session_subscribe":
        session_subscribe(port, sys.argv[3], sys.argv[4])
    elif scenario == "v5_more":
        v5_more(port)
    elif scenario == "session_unacked":
        session_unacked(port)
    elif scenario == "session_clean":
        session_clean(port, sys.argv[3])
    elif scenario == "session_publish":
        session_publish(port, int(sys.argv[3]))
    elif scenario == "session_resume":
        session_resume(port, sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif scenario == "shared":
        shared(port)
    elif scenario == "websocket":
        websocket(port, int(sys.argv[3]))
    elif scenario == "publisher":
        publisher(port, sys.argv[3], int(sys.argv[4]))
    elif scenario == "routes":
        routes_follow_the_catalog(port, int(sys.argv[3]))
    elif scenario == "properties":
        message_properties(port, int(sys.argv[3]))
    elif scenario == "exactly_once_crash":
        exactly_once_crash(port, int(sys.argv[3]))
    else:
        fail(f"unknown scenario {scenario}")
