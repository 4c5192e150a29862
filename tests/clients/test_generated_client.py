"""A client generated from openapi/openapi.json by openapi-python-client drives a real broker.

The client is generated at test time into a temporary directory (no generated code is
committed), imported under a name of its own, and used the way a user would: log in,
declare (with typed arguments), bind, publish, browse, get, ack.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "openapi" / "openapi.json"
PACKAGE = "messagex_openapi"
CONFIG = (
    f"package_name_override: {PACKAGE}\nproject_name_override: messagex-openapi\npost_hooks: []\n"
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModuleType]]:
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert generator, "openapi-python-client is a dev dependency: run make sync"
    out = tmp_path_factory.mktemp("generated")
    config = out / "config.yaml"
    config.write_text(CONFIG)
    result = subprocess.run(
        [
            generator,
            "generate",
            "--path",
            str(SPEC),
            "--output-path",
            str(out / PACKAGE),
            "--meta",
            "none",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(out))
    try:
        names = [
            "",
            ".client",
            ".types",
            ".api.auth.login",
            ".api.exchanges.declare_exchange",
            ".api.queues.declare_queue",
            ".api.queues.get_queue",
            ".api.bindings.create_binding",
            ".api.publish.publish_message",
            ".api.messages.browse_messages",
            ".api.consume.get_messages",
            ".api.consume.ack_delivery",
            ".models",
        ]
        yield {n.lstrip(".") or "package": importlib.import_module(PACKAGE + n) for n in names}
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_declares_binds_publishes_browses_gets_and_acks(
    generated: dict[str, Any], broker: LiveServer
) -> None:
    g = generated
    models = g["models"]
    with g["client"].Client(base_url=broker.base_url, raise_on_unexpected_status=True) as anon:
        login = g["api.auth.login"].sync(
            client=anon, body=models.LoginRequest(username=ADMIN_USER, password=ADMIN_PASSWORD)
        )
    assert isinstance(login, models.LoginResponse), login
    with g["client"].AuthenticatedClient(
        base_url=broker.base_url, token=login.token, raise_on_unexpected_status=True
    ) as api:
        drive(g, models, api)


def drive(g: dict[str, Any], models: Any, api: Any) -> None:
    # The arguments that take effect are typed fields, and only those given are sent.
    exchange = g["api.exchanges.declare_exchange"].sync(
        "gen.orders",
        client=api,
        body=models.ExchangeDeclare(
            type_=models.ExchangeType.TOPIC,
            arguments=models.ExchangeDeclareArguments(alternate_exchange="amq.fanout"),
        ),
    )
    assert isinstance(exchange, models.ExchangeOut), exchange
    assert exchange.type_ == models.ExchangeType.TOPIC
    assert exchange.arguments.additional_properties == {"alternate-exchange": "amq.fanout"}
    arguments = models.QueueDeclareArguments(
        x_max_length=1000, x_overflow=models.QueueDeclareArgumentsXOverflow.REJECT_PUBLISH
    )
    queue = g["api.queues.declare_queue"].sync(
        "gen.invoices",
        client=api,
        body=models.QueueDeclare(max_delivery_count=3, arguments=arguments),
    )
    assert isinstance(queue, models.QueueOut), queue
    assert queue.arguments.additional_properties == {
        "x-max-length": 1000,
        "x-overflow": "reject-publish",
    }
    binding = g["api.bindings.create_binding"].sync(
        client=api,
        body=models.BindingCreate(
            exchange="gen.orders", queue="gen.invoices", routing_key="order.*"
        ),
    )
    assert isinstance(binding, models.BindingOut), binding

    body = models.PublishBody(routing_key="order.created")
    body.body = {"id": 42, "total": "19.90"}
    published = g["api.publish.publish_message"].sync("gen.orders", client=api, body=body)
    assert isinstance(published, models.PublishResponse), published
    assert (published.routed, published.queues) == (True, ["gen.invoices"])

    page = g["api.messages.browse_messages"].sync("gen.invoices", client=api)
    assert isinstance(page, models.StoredMessagePage), page
    (stored,) = page.items
    assert stored.message_id == published.message_id
    assert stored.body == {"id": 42, "total": "19.90"}
    assert stored.routing_key == "order.created"

    got = g["api.consume.get_messages"].sync(
        "gen.invoices", client=api, body=models.GetRequest(max_messages=10)
    )
    assert isinstance(got, models.GetResponse), got
    (delivery,) = got.messages
    assert delivery.body == {"id": 42, "total": "19.90"}
    assert delivery.delivery_count == 1
    in_flight = g["api.queues.get_queue"].sync("gen.invoices", client=api)
    assert in_flight.stats.in_flight == 1

    acked = g["api.consume.ack_delivery"].sync_detailed(delivery.delivery_tag, client=api)
    assert acked.status_code == 204
    after = g["api.queues.get_queue"].sync("gen.invoices", client=api)
    assert (after.stats.ready, after.stats.in_flight) == (0, 0)

    # Errors come back as the documented problem model.
    missing = g["api.queues.get_queue"].sync("gen.nope", client=api)
    assert isinstance(missing, models.Problem), missing
    assert (missing.status, missing.code) == (404, "not_found")
