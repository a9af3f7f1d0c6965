from __future__ import annotations

from typer.testing import CliRunner

from corral.cli import app

runner = CliRunner()


def test_list_env_shows_local_with_its_modes() -> None:
    result = runner.invoke(app, ["list", "env"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    local = next(line for line in result.output.splitlines() if "│ local" in line)
    assert "public" in local and "yes" in local
    assert "features" in result.output
    assert local.rstrip(" │").endswith("snapshot")  # and no reattach: see LocalEnvironment


def test_config_docs_documents_every_field() -> None:
    result = runner.invoke(app, ["config", "docs", "env", "local"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for field in ("owner", "labels", "default_lifetime_s", "root_dir", "output_limit_bytes"):
        assert f"│ {field}" in result.output
    assert "dict[str, str]" in result.output


def test_config_docs_unknown_env() -> None:
    result = runner.invoke(app, ["config", "docs", "env", "nope"])
    assert result.exit_code == 2
    assert "'nope'" in result.output


def test_run_returns_the_command_exit_code() -> None:
    result = runner.invoke(app, ["run", "--", "sh", "-c", "echo out; exit 5"])
    assert result.exit_code == 5
    assert "out" in result.output


def test_run_rejects_unenforceable_policy_naming_it() -> None:
    result = runner.invoke(app, ["run", "--network", "allowlist:a.com", "--", "true"])
    assert result.exit_code == 2
    assert "allowlist" in result.output and "baseline" in result.output


def test_run_rejects_bad_param() -> None:
    result = runner.invoke(app, ["run", "--param", "no_such=1", "--", "true"])
    assert result.exit_code == 2
    assert "no_such" in result.output
