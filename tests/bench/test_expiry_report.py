"""The expiry group's ratios (bench/expiry.py, bench/report.py): expiry / delivery for each
system on its expiring row, and MessageX / RabbitMQ for each removal, as the table and the
JSON's ``ratios`` show them."""

from __future__ import annotations

from bench.expiry import add_ratios
from bench.report import ratios, table
from bench.stats import Result


def _row(name: str, rate: float, cpu: dict[str, float | None]) -> Result:
    system = "rabbitmq" if name.startswith("rabbitmq") else "messagex"
    params = {"copies": 2000, "system": system}
    return Result("expiry", name, params, rate=rate, cpu_s_per_1k=cpu, extra={"round": 1})


def _results() -> list[Result]:
    mx_expire = _row("mx expire 2000", 8000, {"broker": 0.02, "postgres": 0.03, "client": 0.01})
    mx_deliver = _row("mx deliver 2000", 4000, {"broker": 0.06, "postgres": 0.04, "client": 0.1})
    rabbit_expire = _row("rabbitmq expire 2000", 20000, {"rabbitmq": 0.01, "client": 0.005})
    rabbit_deliver = _row("rabbitmq deliver 2000", 5000, {"rabbitmq": 0.08, "client": 0.1})
    add_ratios(mx_expire, mx_deliver)
    add_ratios(rabbit_expire, rabbit_deliver)
    return [mx_expire, mx_deliver, rabbit_expire, rabbit_deliver]


def test_each_system_expiring_row_carries_its_expiry_over_delivery() -> None:
    mx_expire, mx_deliver, rabbit_expire, rabbit_deliver = _results()
    assert mx_expire.extra["cpu_vs_delivery"] == {
        "broker": 0.333,
        "postgres": 0.75,
        "client": 0.1,
        "server": 0.5,  # (0.02 + 0.03) / (0.06 + 0.04)
    }
    assert mx_expire.extra["rate_vs_delivery"] == 2.0
    assert rabbit_expire.extra["cpu_vs_delivery"] == {
        "rabbitmq": 0.125,
        "client": 0.05,
        "server": 0.125,
    }
    assert rabbit_expire.extra["rate_vs_delivery"] == 4.0
    assert "cpu_vs_delivery" not in mx_deliver.extra
    assert "cpu_vs_delivery" not in rabbit_deliver.extra


def test_a_part_not_measured_gives_no_server_ratio() -> None:
    expired = _row("mx expire 2000", 8000, {"broker": 0.02, "postgres": None, "client": 0.01})
    delivered = _row("mx deliver 2000", 4000, {"broker": 0.06, "postgres": 0.04, "client": 0.1})
    add_ratios(expired, delivered)
    assert expired.extra["cpu_vs_delivery"] == {"broker": 0.333, "client": 0.1}


def test_messagex_removals_are_compared_with_rabbitmq_in_the_ratios_and_the_table() -> None:
    results = _results()
    rows = {(r["messagex"], r["baseline"]): r for r in ratios(results)}
    assert set(rows) == {
        ("mx expire 2000", "rabbitmq expire 2000"),
        ("mx deliver 2000", "rabbitmq deliver 2000"),
    }
    expire = rows["mx expire 2000", "rabbitmq expire 2000"]
    assert (expire["rate"], expire["cpu_per_1k"]) == (0.4, 5.0)
    deliver = rows["mx deliver 2000", "rabbitmq deliver 2000"]
    assert (deliver["rate"], deliver["cpu_per_1k"]) == (0.8, 1.25)
    meta = {
        "mode": "smoke",
        "count": 60,
        "message_bytes": 1024,
        "publishers": 4,
        "consumers": 2,
        "machine": {"cpu_count": 2, "loadavg_start": [0.0, 0.0, 0.0]},
    }
    lines = table(meta, results, ratios(results)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("expiry vs delivery"))
    header, section = lines[start], lines[start + 2 : start + 6]
    assert header.split()[-6:] == ["rabbit", "client", "cpu", "e/d", "rate", "e/d"]
    cells = {" ".join(line.split()[:3]): line.split() for line in section}
    assert cells["mx expire 2000"][-6:] == ["0.020", "0.030", "-", "0.010", "0.500", "2.00"]
    assert cells["rabbitmq expire 2000"][-6:] == ["-", "-", "0.010", "0.005", "0.125", "4.00"]
    assert cells["rabbitmq deliver 2000"][-2:] == ["-", "-"]
    ratio_rows = [line for line in lines[start + 6 :] if line.startswith("mx expire 2000 ")]
    assert [line.split()[3:7] for line in ratio_rows] == [["rabbitmq", "expire", "2000", "0.400"]]
