"""One settings model (host/settings/resolve.py): one default and one "unset" per setting, read by every host
from Jupyter's config path, overridable on the command line and in Python, shown by
``ivralo-kernel config``; and what ``install`` writes so that a raw launch (VS Code) enforces it too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from test_vscode_launch import raw_launch

from ivralo_kernel.cli.app import main
from ivralo_kernel.host import ConfigError, IvraloProvisioner, Session, WorkerConfig, WorkerPool
from ivralo_kernel.host.settings.resolve import IvraloAgent, IvraloSettings, JupyterHostSettings
from ivralo_kernel.protocol import names

fast = pytest.mark.fast


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The person's Jupyter config folder, empty (the session's shared one stays untouched)."""
    folder = tmp_path / "jupyter-config"
    folder.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(folder))
    return folder


def write_settings(folder: Path, sections: dict[str, dict[str, object]]) -> Path:
    path = folder / "jupyter_ivralo_config.json"
    path.write_text(json.dumps(sections), encoding="utf-8")
    return path


@fast
def test_each_setting_has_one_default_and_none_is_unset(config_dir: Path) -> None:
    for name in IvraloSettings.class_trait_names(config=True):
        trait = IvraloSettings.class_traits()[name]
        assert trait.help, f"{name} has no help"
    # People's kernels have no deadline unless asked; the agent API's follow the worker reference.
    assert IvraloSettings().deadline_ms is None
    assert WorkerConfig().deadline_ms == 60_000
    assert WorkerConfig(deadline_ms=None).deadline_ms is None
    with pytest.raises(ConfigError, match=r"deadline_ms: 0 is below 1\. Use at least 1, or None for none"):
        WorkerConfig(deadline_ms=0)
    with pytest.raises(ConfigError, match=r"sandbox: 'maybe' is not one of auto, required, off"):
        WorkerConfig(sandbox="maybe")
    with pytest.raises(ConfigError, match="history_cap_bytes: 'lots' is not a number"):
        IvraloSettings(history_cap_bytes="lots")


@fast
def test_every_host_reads_the_config_path_and_says_where_each_value_came_from(config_dir: Path) -> None:
    path = write_settings(
        config_dir,
        {
            "IvraloSettings": {"history_cap_count": 7, "deadline_ms": 9_000},
            "IvraloProvisioner": {"interrupt_grace_ms": 700},
            "IvraloAgent": {"max_workers": 3},
        },
    )
    config = WorkerConfig(deadline_ms=5_000)
    assert (config.history_cap_count, config.interrupt_grace_ms, config.max_workers) == (7, 700, 3)
    assert config.deadline_ms == 5_000  # given in Python beats the file
    assert config.sources["history_cap_count"] == f"{path} (IvraloSettings)"
    assert config.sources["interrupt_grace_ms"] == f"{path} (IvraloProvisioner)"  # it reaches agents too
    assert config.sources["deadline_ms"] == "given in Python"
    pool = WorkerPool(config_dir, role="readonly")  # the pool reads them as well (nothing starts yet)
    assert (pool.config.history_cap_count, pool.settings.role) == (7, "readonly")
    # The provisioner (every Jupyter host): the file, then kernel.json's values.
    provisioner = IvraloProvisioner(kernel_id="k", deadline_ms=4_000)
    assert (provisioner.history_cap_count, provisioner.interrupt_grace_ms, provisioner.deadline_ms) == (7, 700, 4_000)
    assert not hasattr(provisioner, "max_workers")  # agents' section stays with agents


@fast
def test_the_command_line_overrides_the_files(config_dir: Path) -> None:
    write_settings(config_dir, {"IvraloAgent": {"max_workers": 3}})
    config = WorkerConfig.from_command_line(("--IvraloAgent.max_workers=5", "--IvraloSettings.rlimit_nofile=None"))
    assert config.max_workers == 5 and config.sources["max_workers"] == "command line (IvraloAgent)"
    assert config.replace(idle_ttl_seconds=5).max_workers == 5  # a copy keeps its command line
    with pytest.raises(ConfigError, match="--deadline: is not a setting"):
        WorkerConfig.from_command_line(("--deadline",))
    with pytest.raises(ConfigError, match="--Ivralo: is not an ivralo settings section"):
        WorkerConfig.from_command_line(("--Ivralo.deadline_ms=5",))


@fast
def test_a_config_file_that_does_not_load_is_named(config_dir: Path) -> None:
    (config_dir / "jupyter_ivralo_config.py").write_text("c.IvraloSettings.deadline_ms = (\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"jupyter_ivralo_config\.py: this config file does not load \(SyntaxError"):
        WorkerConfig()


@fast
def test_a_session_on_a_pool_refuses_settings_it_would_drop(config_dir: Path) -> None:
    pool = WorkerPool(config_dir)
    with pytest.raises(ConfigError, match=r"config, role: a Session given a pool .* Give them to WorkerPool"):
        Session(pool=pool, config=WorkerConfig(deadline_ms=9_000), role="readonly")


@fast
def test_config_prints_each_value_and_its_source(
    config_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_settings(config_dir, {"IvraloSettings": {"history_cap_count": 7}})
    assert main(["config", "--json", "--IvraloAgent.max_workers=2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jupyter"]["history_cap_count"] == {"value": 7, "from": f"{path} (IvraloSettings)"}
    assert report["jupyter"]["deadline_ms"] == {"value": None, "from": "default"}
    assert report["agent"]["deadline_ms"] == {"value": 60_000, "from": "default"}
    assert report["agent"]["max_workers"] == {"value": 2, "from": "command line (IvraloAgent)"}
    assert "max_workers" not in report["jupyter"]
    assert main(["config"]) == 0
    text = capsys.readouterr().out
    assert f"config files read: {path}" in text
    assert "history_cap_count" in text and f"{path} (IvraloSettings)" in text


@fast
def test_install_writes_what_a_raw_launch_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["install", "--prefix", str(tmp_path), "--name", "ivralo-limits", "--deadline-ms", "1500"]
    assert main([*argv, "--interrupt-grace-ms", "500", "--IvraloProvisioner.rlimit_nofile=512"]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/ivralo-limits/kernel.json").read_text(encoding="utf-8"))
    assert spec["metadata"]["kernel_provisioner"]["config"] == {
        "deadline_ms": 1500,
        "interrupt_grace_ms": 500,
        "rlimit_nofile": 512,
    }
    assert spec["env"] == {
        names.ENV_DEADLINE_MS: "1500",
        names.ENV_INTERRUPT_GRACE_MS: "500",
        names.ENV_RLIMIT_NOFILE: "512",
    }
    # Settings that contradict each other are refused at install, naming the fix.
    assert main([*argv, "--interrupt-grace-ms", "2000"]) == 2
    assert "interrupt_grace_ms: 2000 is not below deadline_ms=1500" in capsys.readouterr().err


def test_a_raw_launch_enforces_the_installed_deadline_and_memory_limit(workspace: Path, tmp_path: Path) -> None:
    """VS Code runs kernel.json's argv itself: no provisioner, no watchdog in a host. The deadline and the
    memory limit that ``install`` was given hold anyway (the kernel's own watchdog, its rlimit)."""
    prefix = tmp_path / "prefix"
    limit = 3 << 30
    flags = ["--deadline-ms", "1500", "--interrupt-grace-ms", "500", "--memory-limit", str(limit)]
    assert main(["install", "--prefix", str(prefix), "--name", "ivralo-limits", *flags]) == 0
    spec = KernelSpecManager(kernel_dirs=[str(prefix / "share/jupyter/kernels")]).get_kernel_spec("ivralo-limits")
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        from kernel_helpers import execute

        looped = execute(raw.client, "while True:\n    pass", timeout=30)
        assert looped.reply["content"]["status"] == "error"
        shown = "\n".join(looped.reply["content"].get("traceback", []))
        assert names.INTERRUPTED_TEXT.format(deadline_ms=1500) in shown
        kept = execute(raw.client, "import resource\nprint(resource.getrlimit(resource.RLIMIT_DATA)[0])")
        assert kept.stdout.strip() == str(limit)


def test_a_setting_in_the_config_file_reaches_an_agent_session(workspace: Path, config_dir: Path) -> None:
    """``c.IvraloProvisioner.*`` in jupyter_ivralo_config reaches the agent API, not only JupyterLab."""
    import asyncio

    write_settings(config_dir, {"IvraloProvisioner": {"deadline_ms": 1500, "interrupt_grace_ms": 500}})

    async def run() -> object:
        async with Session(workspace=workspace) as session:
            return await session.run("while True:\n    pass")

    result = asyncio.run(asyncio.wait_for(run(), 60))
    assert isinstance(result, dict)
    assert result["error"] == names.INTERRUPTED_TEXT.format(deadline_ms=1500)


@fast
def test_the_three_sections_nest(config_dir: Path) -> None:
    assert JupyterHostSettings.section_names()[-2:] == ["IvraloSettings", "IvraloProvisioner"]
    assert IvraloAgent.section_names()[-3:] == ["IvraloSettings", "IvraloProvisioner", "IvraloAgent"]
    assert IvraloProvisioner.section_names()[1] == "IvraloSettings"


@fast
def test_a_short_deadline_brings_its_own_grace(tmp_path: Path) -> None:
    assert WorkerConfig(deadline_ms=1_000).interrupt_grace_ms == 500
    assert IvraloSettings(deadline_ms=60_000).interrupt_grace_ms == 2_000
    # install writes the grace with the deadline: a raw launch does not know the rule
    assert main(["install", "--prefix", str(tmp_path), "--name", "short", "--deadline-ms", "1000"]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/short/kernel.json").read_text(encoding="utf-8"))
    assert spec["env"][names.ENV_INTERRUPT_GRACE_MS] == "500"


@fast
def test_the_launch_policy_defaults_are_the_models() -> None:
    """A raw launch without a variable falls back on KernelPolicy's defaults (protocol/ has no
    traitlets): they must be the model's, or one setting would have two defaults."""
    from ivralo_kernel.protocol import KernelPolicy

    model, policy = IvraloSettings(), KernelPolicy(workspace="/w")
    for name in ("role", "audience", "deadline_ms", "interrupt_grace_ms", "memory_limit_bytes", "rlimit_nofile"):
        assert getattr(policy, name) == getattr(model, name), name
    for name in ("landlock", "landlock_network", "history_cap_bytes", "history_cap_count"):
        assert getattr(policy, name) == getattr(model, name), name


async def test_an_agent_session_without_a_deadline_runs(workspace: Path) -> None:
    """``deadline_ms=None`` is the one way to say "no deadline", for agents too."""
    async with Session(workspace=workspace, config=WorkerConfig(deadline_ms=None)) as session:
        assert await session.run("print(1)") == "1\n"


@fast
def test_a_misspelt_setting_is_named_with_the_likely_one(config_dir: Path) -> None:
    path = write_settings(config_dir, {"IvraloSettings": {"deadlin_ms": 5_000}})
    expected = rf"IvraloSettings.deadlin_ms in {path}: is not an ivralo setting\. Did you mean deadline_ms\?"
    with pytest.raises(ConfigError, match=expected):
        WorkerConfig()
