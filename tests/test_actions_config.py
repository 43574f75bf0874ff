"""[actions]: the shipped rules, a rules file, and the mistakes an admin can make, each refused
with one line naming the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from slurmtel.actions.settings import default_rules
from slurmtel.config import config_from_dict, load_config
from slurmtel.errors import ConfigError


def actions(**values: Any) -> Any:
    return config_from_dict({"actions": values}).actions


def test_the_shipped_rules_apply_until_a_site_names_its_own() -> None:
    shipped = actions().rules
    assert [(r.name, r.kind) for r in shipped] == [
        ("no-process-gpus", "gpus_no_process"),
        ("idle-gpus", "gpus_idle"),
        ("job-end-summary", "job_end"),
        ("node-health", "node_health"),
        ("budgets", "budget"),
        ("statements", "month_closed"),
    ]
    idle = shipped[1]
    assert (idle.warn_minutes, idle.final_warning_minutes, idle.cancel_minutes, idle.cancel) == (
        60,
        105,
        120,
        False,
    )
    assert shipped == default_rules()
    own = actions(rules=[{"name": "mine", "kind": "gpus_idle", "warn_minutes": 30}]).rules
    assert [r.name for r in own] == ["mine"]


def test_a_rules_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nname = "idle"\nkind = "gpus_idle"\nwarn_minutes = 45\n')
    config = tmp_path / "slurmtel.toml"
    config.write_text(f'[actions]\nrules_file = "{rules}"\n')
    assert [(r.name, r.warn_minutes) for r in load_config(config).actions.rules] == [("idle", 45)]
    rules.write_text('[[rules]]\nname = "idle"\nkind = "gpus_idle"\nwarn_minute = 45\n')
    with pytest.raises(ConfigError, match=re.escape("unknown key 'rules[0].warn_minute'")):
        load_config(config)
    rules.write_text('[[rules]]\nname = "idle"\nkind = "gpus_idle"\nwarn_minutes = 45\n')
    config.write_text(
        f'[actions]\nrules_file = "{rules}"\n[[actions.rules]]\nname = "other"\nkind = "budget"\n'
    )
    with pytest.raises(ConfigError, match=re.escape("set actions.rules_file or [[actions.rules]], not both")):
        load_config(config)
    with pytest.raises(ConfigError, match="cannot read"):
        actions(rules_file=str(tmp_path / "missing.toml"))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"name": "Bad Name", "kind": "gpus_idle", "warn_minutes": 1}, "lower-case letters"),
        ({"name": "x", "kind": "gpu_idle", "warn_minutes": 1}, "kind must be one of"),
        ({"name": "x", "kind": "gpus_idle"}, "set warn_minutes, final_warning_minutes or cancel_minutes"),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": 60, "final_warning_minutes": 30}, "warn_minutes <"),
        ({"name": "x", "kind": "gpus_idle", "cancel_minutes": 120, "cancel": True}, "needs final_warning_minutes"),
        (
            {"name": "x", "kind": "gpus_idle", "final_warning_minutes": 100, "cancel_minutes": 120, "cancel": True,
             "to": ["admins"]},
            "needs the owner",
        ),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": 1, "gpus": "most"}, "gpus must be 'any' or 'all'"),
        ({"name": "x", "kind": "budget", "warn_minutes": 5}, "applies only to the gpus_no_process and gpus_idle"),
        ({"name": "x", "kind": "budget", "exclude_users": ["a"]}, "applies only to the job kinds"),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": 1, "xid": False}, "applies only to the node_health"),
        ({"name": "x", "kind": "node_health", "failed_share": 1.5}, "failed_share must be in"),
        ({"name": "x", "kind": "budget", "thresholds_share": []}, "thresholds_share must list"),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": 1, "to": ["someone"]}, "neither an e-mail address nor a role"),
        ({"name": "x", "kind": "node_health", "to": ["owner"]}, "has no owner to tell"),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": 1, "webhooks": ["chat"]}, "no \\[\\[actions.webhooks\\]\\] is named 'chat'"),
        ({"name": "x", "kind": "gpus_idle", "warn_minutes": -1}, "must not be negative"),
    ],
)  # fmt: skip
def test_a_wrong_rule_is_refused_naming_its_key(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        actions(rules=[rule])
    assert "actions.rules[0]" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rules": [{"name": "a", "kind": "budget"}, {"name": "a", "kind": "budget"}]}, "another rule is named 'a'"),
        ({"recipients": {"domain": "not a domain"}}, "not a mail domain"),
        ({"recipients": {"users": {"alice": "alice"}}}, "actions.recipients.users.alice: 'alice' is not an e-mail"),
        ({"recipients": {"admins": ["x@y\r\nBcc: z@w"]}}, "is not an e-mail address"),
        ({"email": {"security": "ssl"}}, "'none', 'starttls' or 'tls'"),
        ({"email": {"username": "u"}}, "username and actions.email.password_file go together"),
        ({"email": {"subject_prefix": "a\nb"}}, "must be one line"),
        ({"webhooks": [{"name": "h", "url": "ftp://x"}]}, "must be an http"),
        ({"webhooks": [{"name": "h", "url": "https://u:p@x/"}]}, "must not hold credentials"),
        ({"webhooks": [{"name": "h", "url": "https://x/", "format": "irc"}]}, "format must be one of"),
        ({"base_url": "slurmtel.example.org"}, "base_url must be an http"),
        ({"retry_backoff_seconds": 0}, "must be positive"),
        ({"retry_backoff_seconds": 600, "retry_backoff_max_seconds": 60}, "at least actions.retry_backoff_seconds"),
    ],
)  # fmt: skip
def test_wrong_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        actions(**values)
