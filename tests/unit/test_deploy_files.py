"""compose.ha.yaml and deploy/: the files that mirror the tested several-brokers topology
(tests/faults/test_several_brokers.py, test_failover.py) must stay consistent with it and
with the broker's own URL handling. Compose itself is not run here (no Docker in CI)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from app.storage.dsn import asyncpg_dsn, sqlalchemy_url
from tests.support import unavailable_here

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.ha.yaml").read_text())
    return loaded


def test_two_brokers_on_both_database_servers_behind_haproxy() -> None:
    services = _compose()["services"]
    assert {"broker1", "broker2", "haproxy", "postgres-primary", "postgres-standby"} <= set(
        services
    )
    for name in ("broker1", "broker2"):
        env = services[name]["environment"]
        url = env["DATABASE_URL"]
        assert "postgres-primary:5432,postgres-standby:5432" in url
        assert url.endswith("?target_session_attrs=read-write")
        # the broker turns it into what each driver reads
        assert "target_session_attrs=read-write" in asyncpg_dsn(url)
        assert "host=" in sqlalchemy_url(url)
        assert env["MESSAGEX_ADMIN_PASSWORD"].startswith("${MESSAGEX_ADMIN_PASSWORD:?")
    primary = " ".join(services["postgres-primary"]["command"])
    assert "synchronous_standby_names=standby" in primary
    assert "synchronous_commit=on" in primary
    mounted = services["haproxy"]["volumes"][0].split(":")[0]
    assert (ROOT / mounted).is_file()


def test_the_scripts_and_config_it_mounts_exist() -> None:
    for service in _compose()["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).is_file(), source


def test_haproxy_config_is_valid_and_names_the_brokers() -> None:
    cfg = (ROOT / "deploy" / "haproxy.cfg").read_text()
    for name in ("broker1", "broker2"):
        assert name in cfg
    assert "/readyz" in cfg
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        unavailable_here("haproxy is missing: apt-get install haproxy (.ci/run does it)")
    # -c: check only. The brokers' names resolve only inside compose's network; the check
    # must not need them (the config resolves at run time, init-addr none).
    done = subprocess.run(
        [haproxy, "-c", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
