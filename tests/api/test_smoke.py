import httpx

from tests.support import LiveServer


def test_healthz(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}
