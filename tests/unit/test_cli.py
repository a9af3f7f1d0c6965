from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.core.environment import BaseEnvironment
from corral.core.registry import EnvironmentRegistry

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


@pytest.fixture(autouse=True)
def root_logging() -> Iterator[None]:
    """Every command configures the root logger (level, handlers); the tests after each
    one here get theirs back (a root left at ERROR hides warnings from `caplog`)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def test_an_error_at_verbosity_0_is_the_one_error_line() -> None:
    result = runner.invoke(app, ["run", "--env", "docker", "--", "true"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: "), result.output
    assert not re.search(r"\d\d:\d\d:\d\d", result.output), result.output
    # With -v the event that said so is there, timestamped.
    result = runner.invoke(app, ["-v", "run", "--env", "docker", "--", "true"])
    assert re.search(r"\d\d:\d\d:\d\d,\d+ corral.environment open failed", result.output)


def test_docker_without_an_image_says_image() -> None:
    result = runner.invoke(app, ["run", "--env", "docker", "--", "true"])
    assert result.exit_code == 2
    assert "--image IMAGE" in result.output and len(result.output.splitlines()) == 1


def test_an_unknown_environment_offers_only_the_installed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Kubernetes provider as where its SDK is missing: its module does not import.
    monkeypatch.setitem(sys.modules, "corral.providers.k8s", None)
    monkeypatch.setattr("corral.cli.ENVIRONMENTS", EnvironmentRegistry(BaseEnvironment))
    result = runner.invoke(app, ["run", "--env", "nope", "--", "true"])
    assert result.exit_code == 2
    assert "unknown environment 'nope'; installed: docker, local" in result.output
    listed = runner.invoke(app, ["list", "env"], env={"COLUMNS": "300"})
    assert "k8s" in listed.output and "no: environment 'k8s' is not installed" in listed.output


def test_a_piped_table_is_not_cut_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    result = runner.invoke(app, ["config", "docs", "env", "local"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) > 80
    row = next(line for line in result.output.splitlines() if "│ default_lifetime_s" in line)
    assert row.rstrip().endswith("│") and len(row.split("│")) == 6, row


def test_mkdocs_output_is_ignored() -> None:
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert "/site/" in ignored


def test_every_corral_gc_the_adapters_and_docs_cite_parses() -> None:
    # Four adapter modules once cited `corral gc --owner`, which gc does not take.
    root = Path(__file__).parents[2]
    sources = [*(root / "src" / "corral").rglob("*.py"), *(root / "docs").glob("*.md")]
    cited = {
        match.group(1)
        for source in sources
        for match in re.finditer(r"`corral gc ([^`]*)`", source.read_text())
    }
    assert any("-p owner=" in args for args in cited), cited
    for args in cited:
        words = re.sub(r"\{\w+\}|\b[A-Z]+\b", "x", args).split()
        # --help last: the options parse, and nothing is collected.
        result = runner.invoke(app, ["gc", *words, "--help"])
        assert result.exit_code == 0, f"`corral gc {args}`: {result.output}"
