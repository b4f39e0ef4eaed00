"""Pure rules shared by every process: the credential rule, databases.json, policy, WorkerConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ivralo_kernel.host import WorkerConfig
from ivralo_kernel.protocol import ConfigError, KernelPolicy, database_env_names, is_secret_name, scrub

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)


@pytest.mark.parametrize(
    "name",
    [
        "OPENAI_API_KEY",
        "api_key",
        "GITHUB_TOKEN",
        "AWS_SECRET",
        "DB_PASSWORD",
        "MY_SECRET_THING",
        "SLACK_WEBHOOK_URL",
        "IVRALO_SQL_URL",
        "PGPASSWORD",
        "GITHUB_PAT",
        "SMTP_PASS",
        "GIT_ASKPASS",
        "AZURE_CREDENTIALS",
        "REGISTRY_AUTH",
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        "DBUS_SESSION_BUS_ADDRESS",
        "TMUX",
        "TMUX_PANE",
        "DOCKER_HOST",
        "VSCODE_IPC_HOOK_CLI",
        "KRB5CCNAME",
    ],
)
def test_credential_names_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "PYTHONPATH", "HOME", "KEYBOARD", "TOKENIZERS_PARALLELISM", "JPY_PARENT_PID", "LANG", "PWD", "OLDPWD"],
)
def test_ordinary_names_are_not(name: str) -> None:
    assert not is_secret_name(name)


def test_a_url_with_a_password_is_removed_whatever_its_name() -> None:
    env = {"DATABASE_URL": "postgres://app:pw@db.internal/shop", "HOMEPAGE": "https://example.org/x@y", "N": "1"}
    clean, removed = scrub(env)
    assert removed == ["DATABASE_URL"]
    assert clean["HOMEPAGE"] == "https://example.org/x@y"


def test_the_persons_rule_adds_names_and_exceptions(tmp_path: Path) -> None:
    """environment.json in the config home: "remove" adds, "keep" excepts from the heuristics only;
    the rule travels on in IVRALO_SCRUB_RULE to a scrub that cannot see the file."""
    (tmp_path / "environment.json").write_text(json.dumps({"remove": ["CORP_*"], "keep": ["PASSENGER_COUNT"]}))
    env = {
        "IVRALO_CONFIG_HOME": str(tmp_path),
        "CORP_INTERNAL": "x",
        "PASSENGER_COUNT": "3",
        "IVRALO_SQL_URL": "sqlite:///x",
        "SHOP_DB": "s",
    }
    clean, removed = scrub(env, {"SHOP_DB"})
    assert removed == ["CORP_INTERNAL", "IVRALO_SQL_URL", "SHOP_DB"]
    assert clean["PASSENGER_COUNT"] == "3"
    inside = {k: v for k, v in clean.items() if k != "IVRALO_CONFIG_HOME"} | {"CORP_LATE": "y"}
    again, removed_again = scrub(inside)
    assert removed_again == ["CORP_LATE"]
    assert again["PASSENGER_COUNT"] == "3"


def test_a_malformed_rule_is_named_not_applied(tmp_path: Path) -> None:
    from ivralo_kernel.protocol.credentials import rule_problems

    (tmp_path / "environment.json").write_text(json.dumps({"remove": "CORP_*"}))
    env = {"IVRALO_CONFIG_HOME": str(tmp_path)}
    expected = f'{tmp_path / "environment.json"}: "remove" must be a list of variable names or patterns'
    assert rule_problems(env) == [expected]


def test_scrub_returns_names_never_values() -> None:
    env = {"PATH": "/bin", "X_API_KEY": "sk-very-secret", "SALES_DB": "postgres://u:pw@h/db"}
    clean, removed = scrub(env, {"SALES_DB"})
    assert clean == {"PATH": "/bin"}
    assert removed == ["SALES_DB", "X_API_KEY"]
    assert "sk-very-secret" not in repr(removed)


def test_databases_json_names_both_shapes(tmp_path: Path) -> None:
    (tmp_path / "databases.json").write_text(
        json.dumps({"databases": {"sales": {"url_env": "SALES_URL", "read_only": True}, "hr": "HR_URL"}})
    )
    found, problems = database_env_names(tmp_path, {"IVRALO_CONFIG_HOME": str(tmp_path / "none")})
    assert found == {"SALES_URL", "HR_URL"} and problems == []


def test_config_home_databases_json_counts_too(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "databases.json").write_text(json.dumps({"crm": {"url_env": "CRM_URL"}}))
    found, _ = database_env_names(tmp_path / "ws", {"IVRALO_CONFIG_HOME": str(home)})
    assert found == {"CRM_URL"}


def test_malformed_databases_json_is_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "databases.json").write_text('{\n  "sales": {"url_env": }\n}')
    found, problems = database_env_names(tmp_path, {"IVRALO_CONFIG_HOME": str(tmp_path / "none")})
    assert found == set()
    assert len(problems) == 1 and "databases.json: line 2" in problems[0]


def test_policy_round_trips_and_validates() -> None:
    policy = KernelPolicy(workspace="/w", memory_limit_bytes=1 << 30)
    assert KernelPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ConfigError, match=r"role: 'admin' is not a role\. Use one of: specialist, readonly"):
        KernelPolicy(workspace="/w", role="admin")


def test_policy_from_kernelspec_env() -> None:
    env = {"IVRALO_WORKSPACE": "/w", "IVRALO_MEMORY_LIMIT_BYTES": "1073741824", "IVRALO_ROLE": "readonly"}
    assert KernelPolicy.from_env(env, "/cwd") == KernelPolicy("/w", "readonly", 1 << 30, None)
    with pytest.raises(ConfigError, match="IVRALO_MEMORY_LIMIT_BYTES: 'lots' is not a whole number"):
        KernelPolicy.from_env({"IVRALO_MEMORY_LIMIT_BYTES": "lots"}, "/cwd")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"deadline_ms": 1000, "interrupt_grace_ms": 1000}, "interrupt_grace_ms: 1000 is not below deadline_ms=1000"),
        ({"memory_soft_limit_bytes": 10, "memory_hard_limit_bytes": 5}, "memory_soft_limit_bytes: 10 is above"),
        ({"deadline_ms": 0}, "deadline_ms: 0 is below 1"),
        ({"max_workers": "8"}, "max_workers: '8' is not a number"),
        ({"prewarm_pool_size": 3, "max_workers": 2}, "prewarm_pool_size: 3 is above max_workers=2"),
    ],
)
def test_worker_config_names_the_field_and_the_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.fast
def test_the_worker_log_is_json_lines_read_back_by_field(tmp_path: Path) -> None:
    from ivralo_kernel.protocol import worker_log

    log = tmp_path / ".ivralo" / "python-worker.log"
    log.parent.mkdir()
    log.write_text("2026-01-01 00:00:00 ivralo kernel failed to start: an entry of the old format\n")
    entry = worker_log.start_failure(
        "ivralo kernel failed to start: it exited with status 1 before it was ready.",
        ["interpreter", "guards installed"],
        "a\n\nTraceback: boom\n",
    )
    worker_log.append(log, entry)
    assert worker_log.entries(log) == [entry]  # the old line is skipped, not misread
    assert worker_log.last_start_failure(log, since=entry["at"]) == ("guards installed", "a | Traceback: boom")
    assert worker_log.last_start_failure(log, since=entry["at"] + 1)[0] == "unknown (no log entry for this start)"


@pytest.mark.fast
def test_exits_and_channel_addresses_are_said_one_way() -> None:
    from ivralo_kernel.protocol.processes import channel_url, describe_exit, from_returncode

    assert from_returncode(-9) == 137 and from_returncode(3) == 3
    assert describe_exit(137) == "was killed by signal SIGKILL"
    assert describe_exit(1) == "exited with status 1"
    assert channel_url({"ip": "127.0.0.1", "shell_port": 5}, "shell") == "tcp://127.0.0.1:5"
    assert channel_url({"transport": "ipc", "ip": "/run/k", "hb_port": 2}, "hb") == "ipc:///run/k-2"
