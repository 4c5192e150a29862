"""messagex_client (clients/python) against a real broker: publish with confirm, subscribe
as an async iterator with ack/nack, reconnect and resubscribe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from messagex_client import (
    AuthenticationError,
    Client,
    ConnectionLost,
    Message,
    NotFound,
    StaleDelivery,
    SubscriptionCancelled,
    UnknownDeliveryTag,
    Unroutable,
    websocket_url,
)

from tests.clients.proxy import Proxy
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, async_wait_for

TIMEOUT = 5.0


@pytest.fixture
async def rest(broker: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=f"{broker.base_url}/api/v1", auth=(ADMIN_USER, ADMIN_PASSWORD), timeout=10
    ) as c:
        yield c


@pytest.fixture
async def mx(broker: LiveServer) -> AsyncIterator[Client]:
    async with Client(broker.base_url, username=ADMIN_USER, password=ADMIN_PASSWORD) as client:
        yield client


async def queue(rest: httpx.AsyncClient, name: str, **declaration: object) -> str:
    r = await rest.put(f"/queues/{name}", json=declaration)
    assert r.status_code in (200, 201), r.text
    return name


async def queue_of_numbers(mx: Client, rest: httpx.AsyncClient, name: str, count: int) -> str:
    """A queue holding the bodies 0 … count-1, published through the client."""
    q = await queue(rest, name)
    for n in range(count):
        await mx.publish(queue=q, body=n)
    return q


async def stats(rest: httpx.AsyncClient, name: str) -> dict[str, int]:
    r = await rest.get(f"/queues/{name}")
    result: dict[str, int] = r.json()["stats"]
    return result


async def next_message(messages: AsyncIterator[Message]) -> Message:
    return await asyncio.wait_for(anext(messages), TIMEOUT)


def test_websocket_url() -> None:
    assert websocket_url("http://h:8000") == "ws://h:8000/api/v1/ws"
    assert websocket_url("https://h/") == "wss://h/api/v1/ws"
    assert websocket_url("ws://h:1/custom/ws") == "ws://h:1/custom/ws"
    with pytest.raises(ValueError, match="not an http"):
        websocket_url("ftp://h")


async def test_publish_returns_the_confirm(mx: Client, rest: httpx.AsyncClient) -> None:
    q = await queue(rest, "py-publish")
    r = await rest.post("/bindings", json={"exchange": "amq.direct", "queue": q, "routing_key": q})
    assert r.status_code == 201
    result = await mx.publish("amq.direct", {"n": 1}, routing_key=q, message_id="m-1")
    assert (result.routed, result.queues, result.message_id) == (True, [q], "m-1")
    # A confirm means committed: the message is there now.
    assert (await stats(rest, q))["ready"] == 1
    direct = await mx.publish(queue=q, body=b"\x00\xffbinary", headers={"k": [1, 2]})
    assert direct.queues == [q]
    unrouted = await mx.publish("amq.direct", 1, routing_key="nobody")
    assert (unrouted.routed, unrouted.queues) == (False, [])
    with pytest.raises(Unroutable):
        await mx.publish("amq.direct", 1, routing_key="nobody", mandatory=True)
    with pytest.raises(NotFound):
        await mx.publish("no-such-exchange", 1)
    with pytest.raises(ValueError, match="exactly one"):
        await mx.publish("amq.direct", 1, queue=q)


async def test_publish_with_an_expiration(mx: Client, rest: httpx.AsyncClient) -> None:
    q = await queue(rest, "py-expiration")
    await mx.publish(queue=q, body="short-lived", expiration_ms=50)
    await mx.publish(queue=q, body="kept")
    r = await rest.get(f"/queues/{q}/messages")
    stored = {m["body"]: m["properties"].get("expiration") for m in r.json()["items"]}
    assert stored == {"short-lived": "50", "kept": None}
    deadline = asyncio.get_running_loop().time() + 5
    while (await stats(rest, q))["ready"] != 1:  # the expired one leaves within a second
        assert asyncio.get_running_loop().time() < deadline, "the copy did not expire"
        await asyncio.sleep(0.05)


async def test_subscribe_iterates_and_settles(mx: Client, rest: httpx.AsyncClient) -> None:
    q = await queue(rest, "py-consume")
    for n in range(3):
        await mx.publish(queue=q, body={"n": n})
    await mx.publish(queue=q, body=b"\x01\x02")
    async with mx.subscribe(q, prefetch=10) as messages:
        received = [await next_message(messages) for _ in range(4)]
        assert [m.body for m in received] == [{"n": 0}, {"n": 1}, {"n": 2}, b"\x01\x02"]
        assert all(m.queue == q and not m.redelivered and m.delivery_count == 1 for m in received)
        assert (await stats(rest, q))["in_flight"] == 4
        await received[0].ack()
        assert await received[1].nack(requeue=False) == "discarded"
        await received[3].ack()
        assert await received[2].nack() == "requeued"
        again = await next_message(messages)
        assert (again.body, again.redelivered, again.delivery_count) == ({"n": 2}, True, 2)
        await again.ack()
    assert await stats(rest, q) == {
        "ready": 0,
        "delayed": 0,
        "in_flight": 0,
        "dead": 0,
        "consumers": 0,
    }


async def test_ack_many_settles_in_one_frame_and_names_what_it_could_not(
    mx: Client, rest: httpx.AsyncClient
) -> None:
    q = await queue_of_numbers(mx, rest, "py-ack-many", 5)
    async with mx.subscribe(q, prefetch=5) as messages:
        received = [await next_message(messages) for _ in range(5)]
        await received[0].ack()
        with pytest.raises(UnknownDeliveryTag) as caught:
            await mx.ack_many(received)
        assert caught.value.frame is not None
        assert caught.value.frame["delivery_tags"] == [received[0].delivery_tag]
        assert all(m.settled for m in received[1:])
        assert (await stats(rest, q))["in_flight"] == 0
        await mx.ack_many([])
    assert (await stats(rest, q))["ready"] == 0


async def test_leaving_the_subscription_returns_unread_deliveries(
    mx: Client, rest: httpx.AsyncClient
) -> None:
    q = await queue_of_numbers(mx, rest, "py-leave", 3)
    async with mx.subscribe(q, prefetch=3) as messages:
        first = await next_message(messages)
        await async_wait_for(
            lambda: _in_flight_is(rest, q, 3), timeout=TIMEOUT, message="the prefetch to fill"
        )
        await first.ack()
    # The two buffered, never handed out, went straight back.
    await async_wait_for(
        lambda: _ready_is(rest, q, 2), timeout=TIMEOUT, message="the unread ones requeued"
    )


async def _in_flight_is(rest: httpx.AsyncClient, q: str, n: int) -> bool:
    return (await stats(rest, q))["in_flight"] == n


async def _ready_is(rest: httpx.AsyncClient, q: str, n: int) -> bool:
    s = await stats(rest, q)
    return s["ready"] == n and s["in_flight"] == 0


async def test_subscription_errors(mx: Client, rest: httpx.AsyncClient) -> None:
    with pytest.raises(NotFound):
        await mx.subscribe("py-missing").start()
    q = await queue(rest, "py-cancel")
    messages = mx.subscribe(q)
    await messages.start()
    assert (await rest.delete(f"/queues/{q}")).status_code == 204
    with pytest.raises(SubscriptionCancelled) as cancelled:
        await next_message(messages)
    assert cancelled.value.reason == "queue_deleted"


async def test_bad_credentials_raise(broker: LiveServer) -> None:
    client = Client(broker.base_url, username=ADMIN_USER, password="wrong")
    with pytest.raises(AuthenticationError):
        await client.connect()
    await client.close()
    token_client = Client(broker.base_url, token="not-a-token")
    with pytest.raises(AuthenticationError):
        await token_client.connect()
    await token_client.close()


async def test_unreachable_broker_raises_on_first_connect() -> None:
    client = Client("http://127.0.0.1:9", username="u", password="p", open_timeout=2)
    with pytest.raises(ConnectionLost):
        await client.connect()
    await client.close()


async def test_reconnects_resubscribes_and_redelivers(
    broker: LiveServer, rest: httpx.AsyncClient
) -> None:
    q = await queue(rest, "py-reconnect")
    proxy = await Proxy(broker.port).start()
    client = Client(
        proxy.url, username=ADMIN_USER, password=ADMIN_PASSWORD, min_backoff=0.05, max_backoff=0.2
    )
    try:
        await client.connect()
        messages = await client.subscribe(q, prefetch=5).start()
        await client.publish(queue=q, body="before")
        held = await next_message(messages)
        assert held.body == "before"

        proxy.drop()  # the network fails under the client
        again = await next_message(messages)  # resubscribed on a new connection
        assert (again.body, again.redelivered, again.delivery_count) == ("before", True, 2)
        assert client.connections == 2
        with pytest.raises(StaleDelivery):
            await held.ack()
        await again.ack()

        # The broker "goes down" for a while: a publish waits for the reconnect.
        proxy.refusing = True
        proxy.drop()
        await async_wait_for(lambda: not client.connected, timeout=TIMEOUT)
        publishing = asyncio.create_task(client.publish(queue=q, body="after"))
        await async_wait_for(lambda: proxy.refused >= 3, timeout=TIMEOUT, message="retries")
        assert not publishing.done()  # still waiting for a connection
        proxy.refusing = False
        result = await asyncio.wait_for(publishing, TIMEOUT)
        assert result.queues == [q]
        after = await next_message(messages)
        assert (after.body, after.redelivered) == ("after", False)
        await after.ack()
        assert client.connections == 3
        assert (await stats(rest, q))["consumers"] == 1
    finally:
        await client.close()
        await proxy.close()


async def test_close_ends_iteration(mx: Client, rest: httpx.AsyncClient) -> None:
    q = await queue(rest, "py-close")
    messages = await mx.subscribe(q).start()
    waiting = asyncio.create_task(anext(messages))
    await asyncio.sleep(0.05)
    await mx.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, TIMEOUT)


async def test_topology_binds_exchanges_and_names_an_alternate(
    mx: Client, rest: httpx.AsyncClient
) -> None:
    """§14 through the client: an exchange-to-exchange binding and an alternate exchange."""
    from messagex_client import Binding

    top = mx.topology
    assert top.root.endswith("/api/v1")
    caught = await queue(rest, "topo-caught")
    reached = await queue(rest, "topo-reached")
    await top.declare_exchange("topo-alt", "fanout")
    await top.bind("topo-alt", queue=caught)
    made = await top.declare_exchange("topo-main", "direct", alternate_exchange="topo-alt")
    assert made["arguments"] == {"alternate-exchange": "topo-alt"}
    await top.declare_exchange("topo-down", "topic")
    await top.bind("topo-down", queue=reached, routing_key="a.*")
    link = await top.bind("topo-main", destination_exchange="topo-down", routing_key="a.b")
    assert link == Binding(link.id, "topo-main", None, "topo-down", "a.b", {})
    assert await top.bindings(destination_exchange="topo-down") == [link]
    assert (await mx.publish("topo-main", 1, routing_key="a.b")).queues == [reached]
    result = await mx.publish("topo-main", 2, routing_key="other", mandatory=True)
    assert (result.routed, result.queues) == (True, [caught])
    with pytest.raises(NotFound):
        await top.declare_exchange("topo-bad", "direct", alternate_exchange="topo-missing")
    with pytest.raises(ValueError, match="exactly one"):
        await top.bind("topo-main")
    await top.unbind(link.id)
    assert await top.bindings(destination_exchange="topo-down") == []
    await top.delete_exchange("topo-down", if_unused=False)
    with pytest.raises(NotFound):
        await top.delete_exchange("topo-down")


async def test_topology_declares_a_queue_with_its_section_13_arguments(mx: Client) -> None:
    """§13 through the client: typed keywords become the RabbitMQ-named arguments, a wrong
    one is ValidationFailed naming it, a different re-declaration PreconditionFailed."""
    from messagex_client.errors import BrokerError

    top = mx.topology
    made = await top.declare_queue(
        "topo-args",
        message_ttl_ms=60000,
        max_length=2,
        overflow="reject-publish",
        max_priority=5,
        single_active_consumer=True,
    )
    assert made["arguments"] == {
        "x-message-ttl": 60000,
        "x-max-length": 2,
        "x-overflow": "reject-publish",
        "x-max-priority": 5,
        "x-single-active-consumer": True,
    }
    for n in range(3):
        result = await mx.publish(None, n, queue="topo-args", priority=n)
        assert result.rejected == ([] if n < 2 else ["topo-args"])
    with pytest.raises(BrokerError, match="x-max-priority") as bad:
        await top.declare_queue("topo-bad", max_priority=300)
    assert bad.value.code == "validation_error"
    with pytest.raises(BrokerError) as differs:
        await top.declare_queue("topo-args", max_length=3)
    assert differs.value.code == "precondition_failed"
    await top.delete_queue("topo-args")
    with pytest.raises(NotFound):
        await top.delete_queue("topo-args")


async def test_single_active_consumer_waits_then_becomes_active(
    broker: LiveServer, mx: Client, rest: httpx.AsyncClient
) -> None:
    """SUBSCRIBED's ``active`` and SUBSCRIPTION_ACTIVE (contract §13) as ``Subscription.active``
    and ``wait_active()``."""
    q = await queue(rest, "py-sac", arguments={"x-single-active-consumer": True})
    plain = await queue(rest, "py-plain")
    async with mx.subscribe(plain) as any_sub:
        assert any_sub.active is True
    async with Client(broker.base_url, username=ADMIN_USER, password=ADMIN_PASSWORD) as other:
        first = await mx.subscribe(q).start()
        assert first.active is True
        second = await other.subscribe(q).start()
        assert second.active is False
        await mx.publish(queue=q, body="to the first")
        message = await asyncio.wait_for(anext(first), TIMEOUT)
        assert message.body == "to the first"
        await message.ack()
        await first.cancel()
        await asyncio.wait_for(second.wait_active(), TIMEOUT)
        assert second.active is True
        await mx.publish(queue=q, body="to the second")
        message = await asyncio.wait_for(anext(second), TIMEOUT)
        assert message.body == "to the second"
        await message.ack()
        await second.cancel()


async def test_message_groups_one_at_a_time(mx: Client) -> None:
    """``declare_queue(message_groups=True)`` and ``publish(group_id=...)`` (contract §16): the
    group's second copy comes only after the first is acked; another group's meanwhile."""
    top = mx.topology
    made = await top.declare_queue("py-groups", message_groups=True)
    assert made["arguments"] == {"x-message-groups": True}
    for body, group in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        await mx.publish(None, body, queue="py-groups", group_id=group)
    async with mx.subscribe("py-groups", prefetch=10) as sub:
        first = await asyncio.wait_for(anext(sub), TIMEOUT)
        second = await asyncio.wait_for(anext(sub), TIMEOUT)
        assert [first.body, second.body] == ["a1", "b1"]
        await first.ack()
        third = await asyncio.wait_for(anext(sub), TIMEOUT)
        assert third.body == "a2"
        await second.ack()
        await third.ack()
    await top.delete_queue("py-groups")


async def test_diagnosis_and_connections_through_the_client(
    mx: Client, rest: httpx.AsyncClient
) -> None:
    """§19 and §20 through the client: a queue's diagnosis names the subscription that holds
    its delivery; the database's side lists this broker; the client's own connection is
    listed and closing another one ends it."""
    top = mx.topology
    q = await queue_of_numbers(mx, rest, "client-diag", 2)
    async with mx.subscribe(q, prefetch=1) as sub:
        await next_message(aiter(sub))
        found = await async_wait_for(
            lambda: top.diagnose_queue(q), TIMEOUT, message="the diagnosis"
        )
        assert found["queue"] == q
        (consumer,) = found["consumers"]
        assert consumer["unacked"] == 1
        assert found["oldest_in_flight"]["holder"]["connection_id"] == consumer["connection_id"]
        assert found["head"]["blocked_by"] == "no_subscriber_with_credit"
        health = await top.diagnose_database()
        assert [p["listening"] for p in health["processes"]] == [True]
        listed = await top.connections()
        assert consumer["connection_id"] in [c["connection_id"] for c in listed]
    with pytest.raises(NotFound):
        await top.close_connection("00000000-0000-0000-0000-000000000000")
    with pytest.raises(NotFound):
        await top.diagnose_queue("client-diag-missing")


async def test_topology_lists_by_name_with_contains(mx: Client) -> None:
    """§20 through the client: exchanges(), queues() and users() follow every page, and
    ``contains`` keeps the names containing the text (case-sensitive)."""
    top = mx.topology
    for name in ("pyls-Cat", "pyls-cat", "pyls-bobcat", "pyls-dog"):
        await top.declare_exchange(name, "fanout")
        await top.declare_queue(name)
    assert [e["name"] for e in await top.exchanges(contains="cat")] == ["pyls-bobcat", "pyls-cat"]
    queues = await top.queues(contains="pyls-")
    assert [q["name"] for q in queues] == ["pyls-Cat", "pyls-bobcat", "pyls-cat", "pyls-dog"]
    assert queues[0]["stats"]["ready"] == 0
    everything = await top.exchanges()
    assert {"amq.direct", "pyls-dog"} <= {e["name"] for e in everything}
    assert [u["username"] for u in await top.users(contains=ADMIN_USER)] == [ADMIN_USER]
    from messagex_client.errors import BrokerError

    with pytest.raises(BrokerError) as caught:
        await top.queues(contains="no spaces")
    assert caught.value.code == "validation_error"
