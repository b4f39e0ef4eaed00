"""Pure rules shared by every process: the credential rule, databases.json, policy, WorkerConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ivralo_kernel.host import WorkerConfig
from ivralo_kernel.protocol import ConfigError, KernelPolicy, database_env_names, is_secret_name, scrub


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
    ],
)
def test_credential_names_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "KEYBOARD", "TOKENIZERS_PARALLELISM", "JPY_PARENT_PID", "LANG"])
def test_ordinary_names_are_not(name: str) -> None:
    assert not is_secret_name(name)


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
