from __future__ import annotations

import logging

from typer.testing import CliRunner

from corral.cli import app

runner = CliRunner()


def test_list_env_shows_local_with_its_modes() -> None:
    result = runner.invoke(app, ["list", "env"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    local = next(line for line in result.output.splitlines() if "│ local" in line)
    assert "public" in local and "yes" in local
    assert "features" in result.output
    features = local.rstrip(" │").rsplit("│", 1)[1]
    assert "snapshot" in features and "reattach" not in features  # see LocalEnvironment


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


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("corral 0.")


def test_a_bad_policy_is_one_line_naming_the_value() -> None:
    result = runner.invoke(app, ["run", "--network", "allowlist:a b", "--", "true"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "'a b'" in lines[0] and "whitespace" in lines[0]
    assert "pydantic" not in lines[0] and "Value error" not in lines[0]


def test_param_takes_json_for_list_and_mapping_fields() -> None:
    args = ["run", "-p", 'inherit_env=["PATH", "CORRAL_T"]', "-p", 'labels={"team": "a"}']
    result = runner.invoke(
        app, [*args, "--", "sh", "-c", 'echo "$CORRAL_T"'], env={"CORRAL_T": "x"}
    )
    assert result.exit_code == 0, result.output
    assert result.output == "x\n"


def test_param_with_broken_json_names_it() -> None:
    result = runner.invoke(app, ["run", "-p", "labels={bad", "--", "true"])
    assert result.exit_code == 2
    assert "'{bad' is not valid JSON" in result.output


def test_verbose_after_the_command_turns_on_debug() -> None:
    root = logging.getLogger()
    before = root.level
    try:
        result = runner.invoke(app, ["run", "-vv", "--", "true"])
        assert result.exit_code == 0, result.output
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(before)


def test_field_names_stay_whole_in_a_narrow_terminal() -> None:
    result = runner.invoke(app, ["config", "docs", "env", "local"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "end_workload_timeout_s" in result.output
    assert "snapshot_lifetime_s" in result.output
