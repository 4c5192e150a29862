"""The broker's object graph: every use-case service, built once by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from app.auth.service import AuthService
from app.broker.inspection import MessageBrowser
from app.metrics import Metrics
from app.broker.publisher import Publisher
from app.broker.topology import TopologyService
from app.config import Settings
from app.storage.database import Database


@dataclass
class Services:
    settings: Settings
    db: Database
    metrics: Metrics
    auth: AuthService
    topology: TopologyService
    publisher: Publisher
    browser: MessageBrowser


def build_services(settings: Settings, db: Database) -> Services:
    metrics = Metrics()
    return Services(
        settings=settings,
        db=db,
        metrics=metrics,
        auth=AuthService(db, settings, metrics),
        topology=TopologyService(db),
        publisher=Publisher(db, metrics, max_message_bytes=settings.max_message_bytes),
        browser=MessageBrowser(db),
    )
