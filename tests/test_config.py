from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmtel.config import Config, config_from_dict, host_timezone, iter_keys, load_config
from slurmtel.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config" / "slurmtel.example.toml"


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    assert load_config() == Config()


def test_unknown_keys_are_rejected_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'sources\.sacct\.intervall_seconds'"):
        config_from_dict({"sources": {"sacct": {"intervall_seconds": 5}}})
    with pytest.raises(ConfigError, match=r"unknown key 'sitee'"):
        config_from_dict({"sitee": {}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sources": {"sacct": {"interval_seconds": "5"}}}, "must be an integer, not a string"),
        ({"sources": {"sacct": {"enabled": 1}}}, "true or false"),
        ({"sources": {"sacct": {"clusters": "lab"}}}, "must be a list"),
        ({"site": {"timezone": "Mars/Olympus"}}, "unknown time zone"),
        ({"sources": {"sacct": {"format": "xml"}}}, "json' or 'parsable"),
        ({"outcomes": {"completed": ["COMPLETED"], "cancelled": ["COMPLETED"]}}, "in both"),
    ],
)
def test_bad_values_are_explained(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # int
        (
            {"sources": {"sacct": {"chunk_seconds": "600s"}}},
            "'sources.sacct.chunk_seconds' must be an integer, not a string ('600s')",
        ),
        ({"sources": {"sacct": {"chunk_seconds": 1.5}}}, "must be an integer, not a decimal number (1.5)"),
        ({"sources": {"sacct": {"chunk_seconds": True}}}, "must be an integer, not true or false"),
        # float
        ({"agent": {"sample_interval_seconds": "1"}}, "must be a number, not a string ('1')"),
        ({"agent": {"sample_interval_seconds": False}}, "must be a number, not true or false"),
        # bool
        ({"sources": {"sacct": {"enabled": "yes"}}}, "'sources.sacct.enabled' must be true or false"),
        # str
        ({"site": {"timezone": 5}}, "'site.timezone' must be a string, not an integer (5)"),
        ({"site": {"timezone": ["UTC"]}}, "'site.timezone' must be a string, not a list"),
        # list
        ({"sources": {"sacct": {"clusters": "lab"}}}, "'sources.sacct.clusters' must be a list"),
    ],
)
def test_type_errors_name_the_types_in_words(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)
    assert message in str(caught.value)
    assert " a int" not in str(caught.value) and " a str," not in str(caught.value)


def test_the_example_config_loads_and_equals_the_defaults() -> None:
    loaded = load_config(EXAMPLE)
    assert loaded == Config()


def test_every_key_is_in_the_example_config_and_the_docs() -> None:
    example = EXAMPLE.read_text()
    readme = (ROOT / "docs" / "configuration.md").read_text()
    tables: dict[str, set[str]] = {}
    table = ""
    # an array of tables ([[chargeback.rates]]) is documented by a commented-out example entry
    commented_entry = False
    for line in example.splitlines():
        if m := re.match(r"^\[([a-z_.]+)\]", line):
            table, commented_entry = m.group(1), False
        elif m := re.match(r"^(#\s*)?\[\[([a-z_.]+)\]\]", line):
            table, commented_entry = m.group(2), bool(m.group(1))
        elif (m := re.match(r"^([a-z_]+)\s*=", line)) or (
            commented_entry and (m := re.match(r"^#\s*([a-z_]+)\s*=", line))
        ):
            tables.setdefault(table, set()).add(m.group(1))
    documented = {f"{t}.{k}" for t, keys in tables.items() for k in keys}
    keys = set(iter_keys())
    assert keys - documented == set(), "keys missing from config/slurmtel.example.toml"
    assert documented - keys == set(), "the example documents keys the code does not have"
    missing = sorted(k for k in keys if f"`{k}`" not in readme)
    assert missing == [], "keys missing from docs/configuration.md's table"


def test_database_url_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "db-url"
    secret.write_text("postgresql://from-file/db\n")
    monkeypatch.delenv("SLURMTEL_DATABASE_URL", raising=False)
    assert config_from_dict({}).database_url() is None
    assert (
        config_from_dict({"database": {"url_file": str(secret)}}).database_url()
        == "postgresql://from-file/db"
    )
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", "postgresql://from-env/db")
    assert (
        config_from_dict({"database": {"url_file": str(secret)}}).database_url() == "postgresql://from-env/db"
    )
    assert config_from_dict({"database": {"url": "postgresql://from-config/db"}}).database_url() == (
        "postgresql://from-config/db"
    )


def test_the_default_prometheus_metrics_are_dcgm_fields() -> None:
    """The config check trusts the defaults without importing the DCGM parser (slurmtel job on
    a login node loads the config too): they must be fields it reads."""
    from slurmtel.config import PrometheusSourceConfig
    from slurmtel.parsers.dcgm import dcgm_field_names

    assert set(PrometheusSourceConfig().metrics) <= dcgm_field_names()


# ------------------------------------------------------------------ site.timezone's default: the host's
# sacct and sreport read and print times in the process's local zone, which glibc takes from
# $TZ, else /etc/localtime, else UTC: site.timezone unset follows the same rule

ZONEINFO = Path("/usr/share/zoneinfo")


def test_the_host_zone_is_tz_when_it_is_set(tmp_path: Path) -> None:
    absent = tmp_path / "localtime"
    assert host_timezone({"TZ": "Europe/Berlin"}, absent) == ("Europe/Berlin", "$TZ=Europe/Berlin")
    assert host_timezone({"TZ": ":America/New_York"}, absent)[0] == "America/New_York"
    assert host_timezone({"TZ": str(ZONEINFO / "Asia" / "Tokyo")}, absent)[0] == "Asia/Tokyo"
    # glibc reads an empty TZ as UTC
    assert host_timezone({"TZ": ""}, absent) == ("UTC", "$TZ is empty: UTC")


def test_the_host_zone_is_etc_localtime_without_tz(tmp_path: Path) -> None:
    link = tmp_path / "localtime"
    link.symlink_to(ZONEINFO / "Europe" / "Berlin")
    assert host_timezone({}, link) == ("Europe/Berlin", f"{link} -> Europe/Berlin")
    # a copy of the zone's file, not a link (some images): found by its content
    copy = tmp_path / "copied-localtime"
    copy.write_bytes((ZONEINFO / "Australia" / "Adelaide").read_bytes())
    assert host_timezone({}, copy)[0] in {"Australia/Adelaide", "Australia/South"}
    # UTC by any of its names is "UTC"
    utc = tmp_path / "utc-localtime"
    utc.symlink_to(ZONEINFO / "Etc" / "UTC")
    assert host_timezone({}, utc)[0] == "UTC"


def test_the_host_zone_is_utc_with_neither(tmp_path: Path) -> None:
    absent = tmp_path / "localtime"
    assert host_timezone({}, absent) == ("UTC", f"no $TZ and no {absent}: UTC")


def test_a_tz_without_an_iana_name_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"\$TZ \('CET-1CEST'\) names no IANA time zone .*set site\.timezone"
    ):
        host_timezone({"TZ": "CET-1CEST"}, tmp_path / "localtime")


def test_site_timezone_unset_is_the_host_zone_and_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    config = config_from_dict({})
    assert (config.site.timezone, config.timezone_name, str(config.zone)) == (
        "",
        "Europe/Berlin",
        "Europe/Berlin",
    )
    assert config.timezone_origin() == "site.timezone unset: the host's zone, $TZ=Europe/Berlin"
    pinned = config_from_dict({"site": {"timezone": "Asia/Tokyo"}})
    assert (pinned.timezone_name, pinned.timezone_origin()) == ("Asia/Tokyo", "site.timezone")
    # a host zone slurmtel cannot name is a config error at load, before any work
    monkeypatch.setenv("TZ", "CET-1CEST")
    with pytest.raises(ConfigError, match=r"set site\.timezone"):
        config_from_dict({})
    assert config_from_dict({"site": {"timezone": "UTC"}}).timezone_name == "UTC"


def test_check_config_prints_the_zone_in_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmtel.cli import main

    monkeypatch.setenv("TZ", "Europe/Berlin")
    file = tmp_path / "slurmtel.toml"
    file.write_text("")
    assert main(["check-config", str(file)]) == 0
    assert "# time zone: Europe/Berlin (site.timezone unset: the host's zone, $TZ=Europe/Berlin)\n" in (
        capsys.readouterr().out
    )
    file.write_text('[site]\ntimezone = "Asia/Tokyo"\n')
    assert main(["check-config", str(file)]) == 0
    assert "# time zone: Asia/Tokyo (site.timezone)\n" in capsys.readouterr().out
