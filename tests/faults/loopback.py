"""The URLs of a server on a loopback port: a broker process, or haproxy in front of several."""

from __future__ import annotations


class LoopbackUrls:
    """``base_url``, ``api`` and ``ws_url`` of whatever listens on 127.0.0.1:``port``."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.base_url}/api/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/ws"
