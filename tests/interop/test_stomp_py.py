"""Interop: Haven driven by stomp.py, a STOMP client this project did not write.

Each test asserts what an application would notice: which messages arrive, how often, with
which headers, and that a broken client gets a readable ERROR without hurting anyone else.
"""

import socket

import pytest

from conftest import Client, read_frame


def bodies(client, n):
    return [client.get().body for _ in range(n)]


def test_send_and_subscribe_queue_and_topic(clients):
    consumer = clients()
    consumer.subscribe("/queue/interop.basic", "q1")
    consumer.subscribe("/topic/interop.basic", "t1")
    producer = clients()
    for i in range(3):
        producer.send("/queue/interop.basic", f"q{i}", **{"x-app-id": str(i)})
    producer.send("/topic/interop.basic", "t0")
    got = [consumer.get() for _ in range(4)]
    queue_msgs = [f for f in got if f.headers["subscription"] == "q1"]
    topic_msgs = [f for f in got if f.headers["subscription"] == "t1"]
    assert [f.body for f in queue_msgs] == ["q0", "q1", "q2"]
    assert [f.headers["x-app-id"] for f in queue_msgs] == ["0", "1", "2"]
    assert all(f.headers["destination"] == "/queue/interop.basic" for f in queue_msgs)
    assert all(f.headers.get("message-id") for f in got)
    assert [f.body for f in topic_msgs] == ["t0"]
    consumer.col.assert_none(0.5)


def test_auto_ack_consumes(clients):
    producer = clients()
    producer.send("/queue/interop.auto", "a1")
    first = clients()
    first.subscribe("/queue/interop.auto", "s", ack="auto")
    assert first.get().body == "a1"
    first.close()
    second = clients()
    second.subscribe("/queue/interop.auto", "s", ack="auto")
    second.col.assert_none(1.0)


def test_client_ack_is_cumulative(clients):
    producer = clients()
    for body in ["c1", "c2", "c3"]:
        producer.send("/queue/interop.client", body)
    first = clients()
    first.subscribe("/queue/interop.client", "s", ack="client")
    got = [first.get() for _ in range(3)]
    assert [f.body for f in got] == ["c1", "c2", "c3"]
    first.ack(got[1])  # acks c1 and c2
    first.close()
    second = clients()
    second.subscribe("/queue/interop.client", "s", ack="client")
    again = second.get()
    assert again.body == "c3"
    assert again.headers.get("redelivered") == "true"
    second.ack(again)
    second.col.assert_none(1.0)


def test_client_individual_ack_acks_one(clients):
    producer = clients()
    for body in ["i1", "i2", "i3"]:
        producer.send("/queue/interop.individual", body)
    first = clients()
    first.subscribe("/queue/interop.individual", "s", ack="client-individual")
    got = [first.get() for _ in range(3)]
    assert [f.body for f in got] == ["i1", "i2", "i3"]
    first.ack(got[1])  # only i2
    first.close()
    second = clients()
    second.subscribe("/queue/interop.individual", "s", ack="client-individual")
    again = [second.get() for _ in range(2)]
    assert [f.body for f in again] == ["i1", "i3"]
    assert all(f.headers.get("redelivered") == "true" for f in again)
    for f in again:
        second.ack(f)
    second.col.assert_none(1.0)


def test_nack_redelivers_with_redelivered_flag(clients):
    producer = clients()
    producer.send("/queue/interop.nack", "n1")
    consumer = clients()
    consumer.subscribe("/queue/interop.nack", "s", ack="client-individual")
    first = consumer.get()
    assert first.body == "n1"
    assert first.headers.get("redelivered", "false") == "false"
    consumer.nack(first)
    second = consumer.get()
    assert second.body == "n1"
    assert second.headers.get("redelivered") == "true"
    consumer.ack(second)
    consumer.col.assert_none(1.0)


def test_transaction_commit_delivers_all_and_abort_delivers_none(clients):
    consumer = clients()
    consumer.subscribe("/queue/interop.tx", "s")
    producer = clients()

    tx = producer.conn.begin()
    producer.conn.send("/queue/interop.tx", "tx-a", transaction=tx)
    producer.conn.send("/queue/interop.tx", "tx-b", transaction=tx)
    consumer.col.assert_none(0.5)  # nothing visible before COMMIT
    rid = "commit-1"
    producer.conn.commit(tx, headers={"receipt": rid})
    producer.col.wait_receipt(rid)
    assert sorted(bodies(consumer, 2)) == ["tx-a", "tx-b"]

    tx2 = producer.conn.begin()
    producer.conn.send("/queue/interop.tx", "tx-c", transaction=tx2)
    producer.conn.send("/queue/interop.tx", "tx-d", transaction=tx2)
    rid = "abort-1"
    producer.conn.abort(tx2, headers={"receipt": rid})
    producer.col.wait_receipt(rid)
    producer.send("/queue/interop.tx", "after-abort")
    # Only the message sent after ABORT arrives; the aborted ones never do.
    assert consumer.get().body == "after-abort"
    consumer.col.assert_none(1.0)


def test_durable_topic_subscription_keeps_messages_across_restart(broker, clients):
    sub = clients(client_id="interop-durable")
    sub.subscribe("/topic/interop.durable", "d1", **{"activemq.subscriptionName": "dur1"})
    producer = clients()
    producer.send("/topic/interop.durable", "online")
    assert sub.get().body == "online"
    sub.close()

    producer.send("/topic/interop.durable", "offline-1", persistent="true")
    producer.send("/topic/interop.durable", "offline-2", persistent="true")
    producer.close()

    broker.restart()

    back = clients(client_id="interop-durable")
    back.subscribe("/topic/interop.durable", "d1", **{"activemq.subscriptionName": "dur1"})
    assert bodies(back, 2) == ["offline-1", "offline-2"]
    back.col.assert_none(1.0)


def test_durable_unsubscribe_removes_the_subscription(clients):
    sub = clients(client_id="interop-durable-gone")
    sub.subscribe("/topic/interop.gone", "d1", **{"activemq.subscriptionName": "gone1"})
    sub.unsubscribe("d1", **{"activemq.subscriptionName": "gone1"})
    sub.close()
    producer = clients()
    producer.send("/topic/interop.gone", "nobody-keeps-this")
    back = clients(client_id="interop-durable-gone")
    back.subscribe("/topic/interop.gone", "d1", **{"activemq.subscriptionName": "gone1"})
    back.col.assert_none(1.0)


def test_temp_queue_request_reply(clients):
    responder = clients()
    responder.subscribe("/queue/interop.requests", "req")
    requester = clients()
    requester.subscribe("/temp-queue/x", "replies")
    requester.send("/queue/interop.requests", "ping", **{"reply-to": "/temp-queue/x", "correlation-id": "c-1"})

    request = responder.get()
    assert request.body == "ping"
    reply_to = request.headers["reply-to"]
    assert reply_to, "reply-to must reach the responder"
    responder.send(reply_to, "pong", **{"correlation-id": request.headers["correlation-id"]})

    reply = requester.get()
    assert reply.body == "pong"
    assert reply.headers["correlation-id"] == "c-1"
    assert reply.headers["subscription"] == "replies"


BAD_FRAMES = {
    "header-without-colon": b"SEND\ndestination:/queue/interop.bad\nno-colon-here\n\nbody\0",
    "unknown-command": b"FROB\ndestination:/queue/interop.bad\n\nbody\0",
    "bad-escape": b"SEND\ndestination:/queue/interop.bad\nx:bad\\qescape\n\nbody\0",
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_frame_gets_error_and_broker_keeps_serving(broker, clients, name):
    bystander = clients()
    bystander.subscribe("/queue/interop.bad.bystander", "b")

    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:
        raw.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
        connected = read_frame(raw)
        assert connected is not None and connected[0] == "CONNECTED", connected
        assert connected[1].get("version") == "1.2"
        raw.sendall(BAD_FRAMES[name])
        error = read_frame(raw)
        assert error is not None, "broker closed without an ERROR frame"
        command, headers, _body = error
        assert command == "ERROR"
        assert headers.get("message"), f"ERROR without a message header: {headers}"
        # Then the broker closes the connection.
        raw.settimeout(10)
        rest = b""
        while True:
            chunk = raw.recv(4096)
            if not chunk:
                break
            rest += chunk
            assert len(rest) < 65536, "broker kept talking after ERROR"

    # The broker and the other client are untouched.
    producer = clients()
    producer.send("/queue/interop.bad.bystander", "still-here")
    assert bystander.get().body == "still-here"
    late = Client(broker)
    late.close()
