"""Settings from the environment (contract §11) and how the CLI reports bad ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import Settings, SettingsError, load_settings
from app.storage.dsn import sqlalchemy_url

MESSAGEX = Path(sys.executable).with_name("messagex")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("MESSAGEX_") or name in {
            "DATABASE_URL",
            "ACK_TIMEOUT_SECONDS",
            "ACK_TIMEOUT_CHECK_INTERVAL_MS",
        }:
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = load_settings()
    assert s.database_url is None  # embedded PostgreSQL
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert s.ack_timeout_seconds == 30
    assert s.ack_timeout_check_interval_ms == 5000
    assert s.max_message_bytes == 1024 * 1024
    assert s.session_ttl_seconds == 86400
    assert s.migrate_on_start is True


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@db:5432/mx", "postgresql+asyncpg://u:p@db:5432/mx"),
        ("postgresql+asyncpg://u:p@db/mx", "postgresql+asyncpg://u:p@db/mx"),
        ("postgres://u@db/mx", "postgresql+asyncpg://u@db/mx"),
    ],
)
def test_database_url_accepts_postgresql_schemes(
    monkeypatch: pytest.MonkeyPatch, url: str, expected: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    s = load_settings()
    assert s.database_url == url
    assert sqlalchemy_url(s.database_url) == expected  # the form the engine is given


@pytest.mark.parametrize("url", ["mysql://u:p@db/mx", "sqlite:///mx.db", "db:5432/mx"])
def test_database_url_rejects_other_databases(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "database_url" in message.lower() or "DATABASE_URL" in message
    assert "\n" not in message


def test_empty_database_url_means_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "")
    assert load_settings().database_url is None


def test_ack_timeouts_are_read_without_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACK_TIMEOUT_SECONDS", "7")
    monkeypatch.setenv("ACK_TIMEOUT_CHECK_INTERVAL_MS", "250")
    s = load_settings()
    assert s.ack_timeout_seconds == 7
    assert s.ack_timeout_check_interval_ms == 250


def test_prefixed_settings_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MESSAGEX_PORT", "9100")
    monkeypatch.setenv("MESSAGEX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MESSAGEX_MAX_MESSAGE_BYTES", "4096")
    monkeypatch.setenv("MESSAGEX_LOG_LEVEL", "WARNING")
    s = load_settings()
    assert (s.port, s.data_dir, s.max_message_bytes, s.log_level) == (
        9100,
        tmp_path,
        4096,
        "warning",
    )


def test_out_of_range_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACK_TIMEOUT_SECONDS", "0")
    with pytest.raises(SettingsError):
        load_settings()


def test_settings_are_immutable() -> None:
    s = Settings()
    with pytest.raises(ValueError, match="frozen"):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "env",
    [
        {"DATABASE_URL": "mysql://root@127.0.0.1/mx"},
        {"MESSAGEX_PORT": "not-a-port"},
        {"ACK_TIMEOUT_SECONDS": "-1"},
        {"MESSAGEX_LOG_LEVEL": "loud"},
    ],
)
def test_cli_reports_invalid_settings_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    result = subprocess.run(
        [str(MESSAGEX), "serve"],
        env={**base, "MESSAGEX_DATA_DIR": str(tmp_path), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("messagex: invalid settings")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "pgdata").exists()  # nothing was started


def _env_names() -> list[str]:
    """The environment variable of every setting (its alias, else ``MESSAGEX_`` + name)."""
    names = []
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        names.append(str(choices[0]) if choices else f"MESSAGEX_{name.upper()}")
    return names


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_every_setting_is_documented(doc: str) -> None:
    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented = {line.split("`")[1] for line in rows}
    assert set(_env_names()) <= documented


def test_readme_and_configuration_doc_show_the_same_table() -> None:
    root = Path(__file__).resolve().parents[2]

    def table(doc: str) -> list[str]:
        lines = (root / doc).read_text().splitlines()
        return [line for line in lines if line.startswith("| `") or line.startswith("| Env")]

    assert table("README.md") == table("docs/configuration.md")
