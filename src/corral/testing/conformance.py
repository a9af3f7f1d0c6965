"""The provider conformance suite. Star-import it into a test module that defines the
fixtures `corral_environment` (a `BaseEnvironment`) and `corral_plan` (an
`ExecutionPlan` whose baseline is `public`):

    from corral.testing.conformance import *  # noqa: F403

Every declared network mode is shown enforced by a probe; every undeclared one must be
refused at `open()`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import ipaddress
import os
import re
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.errors import (
    CorralError,
    FeatureUnsupported,
    NetworkPolicyUnsupported,
    RemotePathNotFound,
    TransferLimitExceeded,
    UnsafeArchiveMember,
)
from corral.network.policy import NetworkMode, NetworkPolicy, NetworkSchedule
from corral.testing.plugin import ConnectCommand, EgressTarget, ServeCommand

__all__ = [
    "test_conformance_aclose_gives_back_the_client_and_the_environment_still_works",
    "test_conformance_close_is_idempotent",
    "test_conformance_dir_round_trip_exact_root",
    "test_conformance_download_dir_refuses_escaping_links",
    "test_conformance_endpoint",
    "test_conformance_env_and_cwd",
    "test_conformance_exec_list_runs_without_shell",
    "test_conformance_exec_string_runs_through_sh",
    "test_conformance_file_round_trip",
    "test_conformance_file_size_limits",
    "test_conformance_invalid_utf8_is_replaced",
    "test_conformance_missing_paths",
    "test_conformance_network_events",
    "test_conformance_network_mode",
    "test_conformance_nonzero_exit_is_a_result",
    "test_conformance_output_is_bounded",
    "test_conformance_sessions_are_isolated",
    "test_conformance_special_files_are_refused_in_time",
    "test_conformance_stdin",
    "test_conformance_streaming_output",
    "test_conformance_timeout_kills_children",
    "test_conformance_undeclared_switch_refused",
    "test_conformance_upload_dir_refuses_escaping_links",
]

anyio_mark = pytest.mark.anyio


async def _workdir(session: EnvironmentSession) -> str:
    result = await session.exec(["pwd"])
    assert result.returncode == 0, result
    return result.stdout.strip()


@anyio_mark
async def test_conformance_exec_list_runs_without_shell(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        result = await sandbox.exec(["echo", "$HOME", "a b"])
    assert result.returncode == 0
    assert result.stdout == "$HOME a b\n"
    assert not result.timed_out


@anyio_mark
async def test_conformance_exec_string_runs_through_sh(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        result = await sandbox.exec("echo $((40 + 2)) | tr 4 x; echo err >&2")
    assert (result.returncode, result.stdout, result.stderr) == (0, "x2\n", "err\n")


@anyio_mark
async def test_conformance_nonzero_exit_is_a_result(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        result = await sandbox.exec("exit 7")
        missing = await sandbox.exec(["corral-no-such-program"])
    assert result.returncode == 7 and not result.ok
    assert missing.returncode in (126, 127), missing


@anyio_mark
async def test_conformance_stdin(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        text = await sandbox.exec(["cat"], stdin="héllo\n")
        raw = await sandbox.exec("wc -c", stdin=b"\x00" * 100_000)
    assert text.stdout == "héllo\n"
    assert raw.stdout.strip() == "100000"


@anyio_mark
async def test_conformance_env_and_cwd(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    plan = corral_plan.model_copy(update={"env": {**corral_plan.env, "CORRAL_PLAN_VAR": "p"}})
    async with corral_environment.session(plan) as sandbox:
        await sandbox.exec(["mkdir", "-p", "sub"])
        result = await sandbox.exec(
            'echo "$CORRAL_PLAN_VAR $CORRAL_EXEC_VAR"; pwd',
            env={"CORRAL_EXEC_VAR": "e"},
            cwd="sub",
        )
    lines = result.stdout.splitlines()
    assert lines[0] == "p e"
    assert lines[1].endswith("/sub")


@anyio_mark
async def test_conformance_timeout_kills_children(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        # A duration no other test uses: the ps check must not see a neighbour's sleep.
        nap = 3000 + secrets.randbelow(6000)
        started = time.monotonic()
        result = await sandbox.exec(
            f"sleep {nap} & echo $! > child.pid; echo started; sleep {nap}", timeout=1.5
        )
        elapsed = time.monotonic() - started
        await anyio.sleep(0.5)
        # A zombie is dead; whether it is reaped yet depends on the sandbox's init.
        child = await sandbox.exec(
            'state=$(ps -o stat= -p "$(cat child.pid)"); '
            'case "$state" in ""|Z*) echo gone;; *) echo alive;; esac'
        )
        survivors = await sandbox.exec(f"ps -eo args | grep '[s]leep {nap}' || true")
    assert result.timed_out and result.returncode in (124, None)
    assert "started" in result.stdout, "output before the timeout is kept"
    assert elapsed < 30, f"timeout of 1.5 s took {elapsed:.1f} s"
    assert child.stdout.strip() == "gone", "the timed-out command's child survived"
    assert survivors.stdout.strip() == "", f"left running: {survivors.stdout!r}"


@anyio_mark
async def test_conformance_streaming_output(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    chunks: list[tuple[str, str, float]] = []

    def on_output(stream: str, text: str) -> None:
        chunks.append((stream, text, time.monotonic()))

    async with corral_environment.session(corral_plan) as sandbox:
        result = await sandbox.exec(
            "echo first; echo warn >&2; sleep 1.5; echo second", on_output=on_output
        )
    out = "".join(t for s, t, _ in chunks if s == "stdout")
    err = "".join(t for s, t, _ in chunks if s == "stderr")
    assert out == result.stdout == "first\nsecond\n"
    assert err == result.stderr == "warn\n"
    first = next(at for s, t, at in chunks if s == "stdout" and "first" in t)
    second = next(at for s, t, at in chunks if s == "stdout" and "second" in t)
    assert second - first > 1.0, "output was not streamed while the command ran"


@anyio_mark
async def test_conformance_output_is_bounded(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        limit = sandbox.output_limit
        size = limit * 3
        result = await sandbox.exec(
            f"printf HEAD; head -c {size} /dev/zero | tr '\\0' x; printf TAIL"
        )
    assert result.returncode == 0
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("HEADxxx") and result.stdout.endswith("xxxTAIL")
    assert len(result.stdout.encode()) < limit + 200


@anyio_mark
async def test_conformance_invalid_utf8_is_replaced(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        result = await sandbox.exec(r"printf 'ok\377\376end'")
    assert result.stdout == "ok\ufffd\ufffdend"


@anyio_mark
async def test_conformance_file_round_trip(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    payload = os.urandom(300_000)
    (tmp_path / "in.bin").write_bytes(payload)
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        await sandbox.write_text(f"{root}/deep/dir/note.txt", "grüße ✓\n")
        text = await sandbox.read_text(f"{root}/deep/dir/note.txt")
        await sandbox.upload(tmp_path / "in.bin", f"{root}/bin/in.bin")
        await sandbox.download(f"{root}/bin/in.bin", tmp_path / "out" / "out.bin")
        size = await sandbox.exec(["wc", "-c", f"{root}/bin/in.bin"])
    assert text == "grüße ✓\n"
    assert (tmp_path / "out" / "out.bin").read_bytes() == payload
    assert size.stdout.split()[0] == str(len(payload))


@anyio_mark
async def test_conformance_file_size_limits(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    """A file over `max_bytes` is refused, naming the path and the limit, before anything
    lands; the same file within its limit, or with none, comes back whole."""
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        path = f"{root}/sized.txt"
        await sandbox.write_text(path, "x" * 5000)
        with pytest.raises(TransferLimitExceeded, match=r"sized\.txt.*5000 bytes.*limit of 4096"):
            await sandbox.read_text(path, max_bytes=4096)
        with pytest.raises(TransferLimitExceeded, match=r"limit of 100\b"):
            await sandbox.download(path, tmp_path / "refused", max_bytes=100)
        whole = await sandbox.read_text(path, max_bytes=5000)
        await sandbox.download(path, tmp_path / "free", max_bytes=None)
    assert whole == "x" * 5000
    assert not (tmp_path / "refused").exists()
    assert (tmp_path / "free").read_text() == "x" * 5000


@anyio_mark
async def test_conformance_missing_paths(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        missing = f"{root}/no/such/file.txt"
        with pytest.raises(RemotePathNotFound, match=re.escape("no/such/file.txt")):
            await sandbox.read_text(missing)
        with pytest.raises(FileNotFoundError):
            await sandbox.download(missing, tmp_path / "x")
        with pytest.raises(FileNotFoundError):
            await sandbox.download_dir(f"{root}/no/such/dir", tmp_path / "y")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


#: seconds a read of a planted special file may take to be refused
REFUSED_WITHIN_S = 10.0
#: what an agent leaves where the grader reads (issue 40, 9): links to endless devices and
#: out of the sandbox, a FIFO nothing writes, devices themselves
_PLANTED = (
    "ln -s /dev/zero zero.txt && ln -s /etc/hostname out.txt && mkfifo fifo.txt "
    "&& ln -s fifo.txt to-fifo.txt"
)


async def _read_answer(
    sandbox: EnvironmentSession, read: Callable[[], Awaitable[object]], fifo: str
) -> tuple[str, float]:
    """How a read ended (its error's message, or "returned") and in how many seconds."""
    started = time.monotonic()
    answer = "returned"

    async def release() -> None:
        # A read stuck in a thread no cancellation stops (a FIFO's open) ends once a
        # writer opens the FIFO: the test then fails on its time, it does not hang.
        await anyio.sleep(REFUSED_WITHIN_S + 1)
        await sandbox.exec(f"exec 3>{shlex.quote(fifo)}", timeout=5)

    async with anyio.create_task_group() as group:
        group.start_soon(release)
        with anyio.move_on_after(REFUSED_WITHIN_S):
            try:
                await read()
            except CorralError as exc:
                answer = str(exc)
        group.cancel_scope.cancel()
    return answer, time.monotonic() - started


@anyio_mark
async def test_conformance_special_files_are_refused_in_time(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    """Security round 4 (issue 40, 9): a read of a link to /dev/zero, a FIFO, a device or a
    link out of the sandbox is refused with an error naming the path, within seconds, by
    each file call; never an endless read nor a wait for a writer."""
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        planted = await sandbox.exec(_PLANTED)
        assert planted.ok, planted
        fifo = f"{root}/fifo.txt"
        answers: dict[str, tuple[str, float]] = {}
        for name in ("zero.txt", "out.txt", "fifo.txt", "to-fifo.txt", "/dev/zero", "/dev/urandom"):
            path = name if name.startswith("/") else f"{root}/{name}"
            answers[f"read_text {name}"] = await _read_answer(
                sandbox, functools.partial(sandbox.read_text, path), fifo
            )
            answers[f"download {name}"] = await _read_answer(
                sandbox, functools.partial(sandbox.download, path, tmp_path / "got"), fifo
            )
        alive = await sandbox.exec("echo alive")
    late = {call: seconds for call, (_, seconds) in answers.items() if seconds > REFUSED_WITHIN_S}
    unnamed = {
        call: answer for call, (answer, _) in answers.items() if call.split(" ", 1)[1] not in answer
    }
    assert late == {} and unnamed == {}, answers
    assert alive.stdout == "alive\n" and not (tmp_path / "got").exists()


def _make_tree(root: Path) -> set[str]:
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.txt").write_text("top")
    (root / "a" / "mid.txt").write_text("mid")
    (root / "a" / "b" / "leaf.bin").write_bytes(os.urandom(70_000))
    (root / "a" / "link.txt").symlink_to("mid.txt")
    (root / "empty").mkdir()
    return {"top.txt", "a/mid.txt", "a/b/leaf.bin"}


def _files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


@anyio_mark
async def test_conformance_dir_round_trip_exact_root(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    expected = _make_tree(source)
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        await sandbox.upload_dir(source, f"{root}/dest")
        listing = await sandbox.exec("find . -type f | sort", cwd=f"{root}/dest")
        link = await sandbox.exec(["cat", f"{root}/dest/a/link.txt"])
        await sandbox.download_dir(f"{root}/dest", tmp_path / "back")
    assert {line.removeprefix("./") for line in listing.stdout.split()} == expected
    assert link.stdout == "mid"
    assert _files(tmp_path / "back") == expected
    assert (tmp_path / "back" / "empty").is_dir()
    assert (tmp_path / "back" / "a" / "link.txt").read_text() == "mid"
    for name in expected:
        assert (tmp_path / "back" / name).read_bytes() == (source / name).read_bytes()


@anyio_mark
async def test_conformance_upload_dir_refuses_escaping_links(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "ok.txt").write_text("ok")
    (source / "evil").symlink_to("../../../../etc")
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        with pytest.raises(UnsafeArchiveMember, match="evil"):
            await sandbox.upload_dir(source, f"{root}/up")
        after = await sandbox.exec(["ls", "-A", f"{root}/up"])
    assert "evil" not in after.stdout


@anyio_mark
async def test_conformance_download_dir_refuses_escaping_links(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, tmp_path: Path
) -> None:
    async with corral_environment.session(corral_plan) as sandbox:
        root = await _workdir(sandbox)
        await sandbox.exec(
            "mkdir -p down && echo ok > down/ok.txt && ln -s /etc/hostname down/abs "
            "&& ln -s ../../../../../etc down/up",
            cwd=root,
        )
        with pytest.raises(UnsafeArchiveMember):
            await sandbox.download_dir(f"{root}/down", tmp_path / "out")
    assert not (tmp_path / "out").exists(), "a refused archive must leave nothing behind"


@anyio_mark
async def test_conformance_endpoint(
    corral_environment: BaseEnvironment,
    corral_plan: ExecutionPlan,
    corral_serve_command: ServeCommand,
) -> None:
    port = 18_080
    async with corral_environment.session(corral_plan) as sandbox:
        url = await sandbox.endpoint(port)
        if url is None:
            return  # allowed by the contract: this provider cannot serve endpoints
        received = await served_through(sandbox, url, corral_serve_command(port, "ok"))
    assert received.startswith(b"ok")


async def served_through(sandbox: EnvironmentSession, url: str, serve: list[str]) -> bytes:
    """What the caller receives at `url` while the sandbox runs `serve` (a one-shot
    server on the endpoint's port), retried until it answers (30 s at most)."""
    host, _, port_text = url.removeprefix("http://").rstrip("/").rpartition(":")
    received = b""
    async with anyio.create_task_group() as tg:
        tg.start_soon(sandbox.exec, serve)
        with anyio.fail_after(30):
            while not received:
                try:
                    stream = await anyio.connect_tcp(host.strip("[]"), int(port_text))
                except OSError:
                    await anyio.sleep(0.2)
                    continue
                async with stream:
                    try:
                        received = await stream.receive()
                    except (anyio.EndOfStream, OSError):
                        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    return received


async def _reaches(
    sandbox: EnvironmentSession, connect: ConnectCommand, target: EgressTarget
) -> bool:
    result = await sandbox.exec(connect(target), timeout=20)
    return result.returncode == 0


def _mode_policy(
    mode: NetworkMode, targets: list[EgressTarget], env: BaseEnvironment
) -> NetworkPolicy:
    ports = env.network_capabilities().target_ports
    allowed, denied = targets
    entry = str(allowed) if ports else allowed.host
    if mode is NetworkMode.ALLOWLIST:
        return NetworkPolicy.allowlist(entry)
    if mode is NetworkMode.DENYLIST:
        return NetworkPolicy.denylist(str(denied) if ports else denied.host)
    return NetworkPolicy(network_mode=mode)


@anyio_mark
@pytest.mark.parametrize("mode", list(NetworkMode))
async def test_conformance_network_mode(
    corral_environment: BaseEnvironment,
    corral_plan: ExecutionPlan,
    corral_egress_targets: list[EgressTarget],
    corral_connect_command: ConnectCommand,
    mode: NetworkMode,
) -> None:
    """A declared mode is enforced (probed both ways); an undeclared one is refused."""
    first, second = corral_egress_targets
    caps = corral_environment.network_capabilities()
    if mode not in caps.modes:
        simple = mode in (NetworkMode.PUBLIC, NetworkMode.NO_NETWORK)
        baseline = mode.value if simple else f"{mode.value}:{first}"
        plan = corral_plan.model_copy(
            update={"network": NetworkSchedule.model_validate({"baseline": baseline})}
        )
        with pytest.raises(NetworkPolicyUnsupported, match=mode.value):
            await corral_environment.open(plan)
        return
    if mode in (NetworkMode.ALLOWLIST, NetworkMode.DENYLIST) and not caps.target_ports:
        assert first.host != second.host, "targets must differ by host if ports cannot be matched"
    policy = _mode_policy(mode, corral_egress_targets, corral_environment)
    plan = corral_plan.model_copy(update={"network": NetworkSchedule(baseline=policy)})
    async with corral_environment.session(plan) as sandbox:
        assert sandbox.policy == policy
        reach_first = await _reaches(sandbox, corral_connect_command, first)
        reach_second = await _reaches(sandbox, corral_connect_command, second)
    expected = {
        NetworkMode.PUBLIC: (True, True),
        NetworkMode.NO_NETWORK: (False, False),
        NetworkMode.ALLOWLIST: (True, False),
        NetworkMode.DENYLIST: (True, False),
    }[mode]
    assert (reach_first, reach_second) == expected, f"{mode.value} not enforced"


@anyio_mark
async def test_conformance_network_events(
    corral_environment: BaseEnvironment,
    corral_plan: ExecutionPlan,
    corral_egress_targets: list[EgressTarget],
    corral_connect_command: ConnectCommand,
) -> None:
    """A provider that declares `supports_network_events` lists a refused attempt (its
    destination and port) as refused and an allowed connection as admitted; any other
    raises `FeatureUnsupported` naming the feature."""
    env = corral_environment
    if not env.features().supports_network_events:
        async with env.session(corral_plan) as sandbox:
            with pytest.raises(FeatureUnsupported, match="network_events"):
                sandbox.network_events()
        return
    if NetworkMode.ALLOWLIST not in env.network_capabilities().modes:
        pytest.skip("events are checked under an allowlist, which this provider lacks")
    first, second = corral_egress_targets
    policy = _mode_policy(NetworkMode.ALLOWLIST, corral_egress_targets, env)
    plan = corral_plan.model_copy(update={"network": NetworkSchedule(baseline=policy)})
    async with env.session(plan) as sandbox:
        assert await _reaches(sandbox, corral_connect_command, first)
        assert not await _reaches(sandbox, corral_connect_command, second)
        deadline = time.monotonic() + 10
        while True:
            events = sandbox.network_events()
            seen = {(str(e.destination), e.port) for e in events.refused()}
            reached = {(str(e.destination), e.port) for e in events.allowed()}
            if (second.host, second.port) in seen and (first.host, first.port) in reached:
                break
            if time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)
    assert (second.host, second.port) in seen, f"the refused {second} is not listed: {seen}"
    assert (first.host, first.port) not in seen, f"the allowed {first} is listed as refused"
    assert (first.host, first.port) in reached, f"the allowed {first} is not listed: {reached}"
    assert (second.host, second.port) not in reached, f"the refused {second} is listed allowed"


async def _own_addresses(sandbox: EnvironmentSession) -> list[str]:
    """The sandbox's addresses as it sees them itself (`ip`, else `hostname -i`)."""
    result = await sandbox.exec("ip -o addr show scope global 2>/dev/null || hostname -i")
    found: list[str] = []
    for word in result.stdout.split():
        try:
            found.append(str(ipaddress.ip_interface(word).ip))
        except ValueError:
            continue
    return list(dict.fromkeys(found))


async def _answers(
    sandbox: EnvironmentSession, connect: ConnectCommand, target: EgressTarget, tries: int
) -> bool:
    """Whether `target` answers within `tries` attempts (a one-shot listener restarts)."""
    for _ in range(tries):
        if await _reaches(sandbox, connect, target):
            return True
        await anyio.sleep(0.2)
    return False


@anyio_mark
async def test_conformance_sessions_are_isolated(
    corral_environment: BaseEnvironment,
    corral_plan: ExecutionPlan,
    corral_connect_command: ConnectCommand,
    corral_serve_command: ServeCommand,
) -> None:
    """A sandbox accepts no connection from another sandbox, even when both are `public`."""
    if not corral_environment.isolates_sessions:
        pytest.skip(
            f"provider {corral_environment.id!r} declares isolates_sessions = False: "
            "its sessions share one network"
        )
    port = 18_090
    serve = shlex.join(corral_serve_command(port, "ok"))
    stop = ".corral-isolation-stop"
    async with (
        corral_environment.session(corral_plan) as server,
        corral_environment.session(corral_plan) as client,
    ):
        addresses = await _own_addresses(server)
        assert addresses, "the listening sandbox shows no address of its own"
        listener = EgressTarget(addresses[0], port)
        reached: list[str] = []
        still = False
        async with anyio.create_task_group() as tg:
            loop = f"until [ -e {stop} ]; do {serve}; done"
            tg.start_soon(lambda: server.exec(loop, timeout=120))
            # The listener answers on its own address: a refusal below is the isolation's.
            if not await _answers(server, corral_connect_command, listener, tries=100):
                pytest.fail(f"the listener never answered on {listener} in its own sandbox")
            for address in addresses:
                target = EgressTarget(address, port)
                if await _answers(client, corral_connect_command, target, tries=3):
                    reached.append(address)
            await server.exec(["touch", stop])
            # This last connection also lets the listener's loop see `stop` and end.
            still = await _answers(server, corral_connect_command, listener, tries=50)
    assert reached == [], f"another sandbox connected to {reached} port {port}"
    assert still, "the listener stopped answering in its own sandbox during the check"


@anyio_mark
async def test_conformance_undeclared_switch_refused(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """A static provider refuses a live switch; a dynamic one switches and reports it."""
    caps = corral_environment.network_capabilities()
    target = NetworkPolicy.no_network() if NetworkMode.NO_NETWORK in caps.modes else None
    async with corral_environment.session(corral_plan) as sandbox:
        if target is None:
            return  # public is the only mode: there is nothing to switch to
        if not caps.dynamic:
            with pytest.raises(NetworkPolicyUnsupported):
                await sandbox.set_network_policy(target)
            assert sandbox.policy == corral_plan.network.baseline
        else:
            await sandbox.set_network_policy(target)
            assert sandbox.policy == target


@anyio_mark
async def test_conformance_close_is_idempotent(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    sandbox = await corral_environment.open(corral_plan)
    assert (await sandbox.exec(["true"])).returncode == 0
    await corral_environment.close(sandbox)
    await corral_environment.close(sandbox)
    assert sandbox.closed


def _open_sockets() -> int:
    """This process's sockets (an engine's or API server's connections among them)."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            count += str(fd.readlink()).startswith("socket:")
    return count


@anyio_mark
async def test_conformance_aclose_gives_back_the_client_and_the_environment_still_works(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """`env.aclose()` leaves no connection of the environment's open (what remains after a
    collection is the client's garbage, not the environment's pool); the environment
    still works after it, connecting again."""
    await corral_environment.aclose()
    gc.collect()
    before = _open_sockets()
    async with corral_environment.session(corral_plan) as sandbox:
        assert (await sandbox.exec(["echo", "hi"])).stdout == "hi\n"
    await corral_environment.aclose()
    gc.collect()
    assert _open_sockets() <= before
    async with corral_environment, corral_environment.session(corral_plan) as sandbox:
        assert (await sandbox.exec(["echo", "again"])).stdout == "again\n"
    gc.collect()
    assert _open_sockets() <= before
