"""Hostile archives: no member, link or chain of links may touch anything outside the
destination (on Kubernetes the archive is whatever the Pod's `tar` prints)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.tarsafe import extract_file, extract_tar
from corral.errors import TransferLimitExceeded, UnsafeArchiveMember
from tests.hostile import (
    CHAIN,
    DIR,
    FILE,
    HARDLINK,
    SYMLINK,
    Member,
    crafted_tar,
    escaping_links,
    hardlink_chain,
    host_tree,
    snapshot,
)


def _open_descriptors() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def _extract(members: list[Member], dest: Path) -> None:
    data = crafted_tar(members)
    extract_tar([data[i : i + 1000] for i in range(0, len(data), 1000)], dest)


@pytest.mark.parametrize(
    "members",
    [
        pytest.param(CHAIN, id="symlink-chain"),
        pytest.param(hardlink_chain("outside/victim"), id="hardlink-through-chain"),
        # `d/..` is the root's parent when `d -> .`, though counting says the root.
        pytest.param(
            [("d", SYMLINK, ".", b""), ("sub", DIR, "", b""), ("sub/l", SYMLINK, "../d/..", b"")],
            id="dotdot-after-a-link",
        ),
        pytest.param(
            [("f", FILE, "", b"f"), ("s", SYMLINK, ".", b""), ("h", HARDLINK, "s/f", b"")],
            id="hardlink-target-through-a-symlink",
        ),
        pytest.param([("l", SYMLINK, "", b"")], id="empty-link"),
        pytest.param([("f", FILE, "", b"f"), ("f/x", FILE, "", b"x")], id="path-through-a-file"),
    ],
)
def test_chains_of_links_are_refused(tmp_path: Path, members: list[Member]) -> None:
    dest = host_tree(tmp_path)
    before = snapshot(tmp_path, skip=dest)
    with pytest.raises(UnsafeArchiveMember, match="would land outside"):
        _extract(members, dest)
    assert snapshot(tmp_path, skip=dest) == before
    assert not dest.exists()


def test_a_link_already_in_the_destination_is_replaced_not_followed(tmp_path: Path) -> None:
    dest = host_tree(tmp_path)
    dest.mkdir()
    (dest / "d").symlink_to(tmp_path / "outside" / "dir")
    (dest / "v").symlink_to(tmp_path / "outside" / "victim")
    before = snapshot(tmp_path, skip=dest)
    _extract([("d", DIR, "", b""), ("d/x", FILE, "", b"x"), ("v", FILE, "", b"new")], dest)
    assert snapshot(tmp_path, skip=dest) == before
    assert not (dest / "d").is_symlink() and (dest / "d" / "x").read_text() == "x"
    assert not (dest / "v").is_symlink() and (dest / "v").read_text() == "new"


def test_links_that_stay_inside_land(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    _extract(
        [
            ("a/b", DIR, "", b""),
            ("a/b/f", FILE, "", b"f"),
            ("top", SYMLINK, "a/b/f", b""),
            ("a/b/up", SYMLINK, "../../top", b""),
            ("a/here", SYMLINK, ".", b""),
            ("hard", HARDLINK, "a/b/f", b""),
        ],
        dest,
    )
    assert (dest / "a" / "b" / "up").read_text() == "f"
    assert (dest / "a" / "here" / "b" / "f").read_text() == "f"
    assert (dest / "hard").samefile(dest / "a" / "b" / "f")
    assert escaping_links(dest) == []


def test_a_rewritten_member_is_a_new_file(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    _extract([("f", FILE, "", b"one"), ("h", HARDLINK, "f", b""), ("h", FILE, "", b"two")], dest)
    assert (dest / "f").read_text() == "one" and (dest / "h").read_text() == "two"


def test_extract_file_replaces_a_symlink_at_the_destination(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("host file")
    (tmp_path / "out").symlink_to(victim)
    extract_file([crafted_tar([("f", FILE, "", b"data")])], tmp_path / "out", "f", None)
    assert victim.read_text() == "host file"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_text() == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]


@pytest.mark.parametrize("kind", [SYMLINK, HARDLINK])
def test_extract_file_refuses_a_link(tmp_path: Path, kind: bytes) -> None:
    with pytest.raises(UnsafeArchiveMember, match="not a regular file"):
        extract_file([crafted_tar([("f", kind, "/etc/hostname", b"")])], tmp_path / "o", "f", None)
    assert list(tmp_path.iterdir()) == []


def test_extract_file_refuses_a_file_over_the_limit_before_reading_it(tmp_path: Path) -> None:
    """Security round 3: a sandbox's file of any size reached the harness whole."""
    read: list[int] = []

    def chunks() -> Iterator[bytes]:
        data = crafted_tar([("big", FILE, "", b"x" * 500_000)])
        for start in range(0, len(data), 512):
            read.append(start)
            yield data[start : start + 512]

    with pytest.raises(TransferLimitExceeded, match=r"'big'.*500000 bytes.*limit of 4096"):
        extract_file(chunks(), tmp_path / "o", "big", 4096)
    assert list(tmp_path.iterdir()) == [], "nothing written"
    assert len(read) * 512 <= 20_480, "no more than tarfile's first record was read"


def test_deep_and_interleaved_trees_land_whole_without_holding_descriptors(
    tmp_path: Path,
) -> None:
    """Extraction keeps the way to the last member's directory open for the next one:
    a tree deeper than that (a hostile depth must not become as many descriptors), and
    members that leave a directory and come back, land exactly; nothing stays open."""
    deep = "/".join(f"d{n}" for n in range(300))
    members: list[Member] = [
        ("a/b/x", FILE, "", b"x"),
        ("c/y", FILE, "", b"y"),
        ("a/b/z", FILE, "", b"z"),
        (f"{deep}/leaf", FILE, "", b"deep"),
        ("d0/d1/side", FILE, "", b"side"),
        (f"{deep}/leaf2", FILE, "", b"deep2"),
    ]
    before = _open_descriptors()
    _extract(members, tmp_path / "out")
    assert _open_descriptors() == before
    out = tmp_path / "out"
    assert [(out / n).read_bytes() for n, *_ in members] == [m[3] for m in members]
    with pytest.raises(UnsafeArchiveMember, match="'a/b' would replace the directory"):
        _extract([("a/b/x", FILE, "", b"x"), ("a/b", SYMLINK, ".", b"")], tmp_path / "o2")
    assert _open_descriptors() == before


# The property: random chains of links (symbolic and hard, relative and absolute, with
# `..`, through earlier links), directories and files; two archives into one destination.
_LEAVES = ["s", "x", "a"]
_OUTSIDE = "@outside"  # replaced by the absolute path of tmp/outside
_TARGETS = [
    ".",
    "..",
    "../..",
    "{p}",
    "{p}/..",
    "{p}/../..",
    "../{p}",
    "{p}/{leaf}",
    "{p}/../outside/victim",
    f"{_OUTSIDE}/victim",
    "/",
]


def _looks_inside(name: str, target: str) -> bool:
    """What a lexical check of one link sees: `..` counted from the link's directory."""
    depth = name.count("/")
    for part in target.split("/"):
        depth += {"..": -1, ".": 0, "": 0}.get(part, 1)
        if depth < 0:
            return False
    return not target.startswith("/")


@st.composite
def _archives(draw: st.DrawFn) -> list[Member]:
    """Members whose names go through earlier members and whose targets name them.

    Half the archives are lexically clean (every name and link looks inside on its own),
    so that what escapes, if anything, does so through the chaining alone.
    """
    clean = draw(st.booleans())
    members: list[Member] = []
    names: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        base = draw(st.sampled_from(["", *names] if clean else ["", "..", *names]))
        leaves = draw(st.lists(st.sampled_from(_LEAVES), min_size=1, max_size=2))
        name = "/".join(part for part in [base, *leaves] if part)
        kind = draw(st.sampled_from([SYMLINK, SYMLINK, SYMLINK, FILE, HARDLINK, DIR]))
        link = ""
        if kind in (SYMLINK, HARDLINK):
            link = draw(st.sampled_from(_TARGETS)).format(
                p=draw(st.sampled_from(names or ["s"])), leaf=draw(st.sampled_from(_LEAVES))
            )
            if clean and not _looks_inside(name if kind == SYMLINK else "", link):
                link = "."
        members.append((name, kind, link, b"pwned" if kind == FILE else b""))
        names.append(name)
    return members


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(first=_archives(), second=_archives())
def test_no_archive_touches_anything_outside_the_destination(
    first: list[Member], second: list[Member]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        dest = host_tree(tmp)
        before = snapshot(tmp, skip=dest)
        for members in (first, second):
            concrete = [
                (name, kind, link.replace(_OUTSIDE, str(tmp / "outside")), data)
                for name, kind, link, data in members
            ]
            inside = snapshot(dest, skip=dest / "-") if dest.exists() else None
            try:
                _extract(concrete, dest)
            except UnsafeArchiveMember:
                now = snapshot(dest, skip=dest / "-") if dest.exists() else None
                assert now == inside, "a refused archive changed the destination"
            assert snapshot(tmp, skip=dest) == before
            if dest.exists():
                assert escaping_links(dest) == []
