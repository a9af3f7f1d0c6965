from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from corral.core.output import BoundedOutput, StreamDecoder
from corral.core.paths import resolve_within
from corral.core.redact import redact
from corral.core.tarsafe import extract_tar, owned_by_root, pack_dir
from corral.errors import ConfigError, UnsafeArchiveMember


def test_bounded_output_keeps_head_and_tail() -> None:
    out = BoundedOutput(limit=10)
    for chunk in (b"HEAD", b"x" * 100, b"TAIL!"):
        out.feed(chunk)
    assert out.truncated and out.total == 109
    text = out.text()
    assert text.startswith("HEADx") and text.endswith("TAIL!")
    assert "99 bytes truncated" in text


def test_bounded_output_small_is_exact() -> None:
    out = BoundedOutput(limit=100)
    out.feed(b"hello \xff")
    assert not out.truncated
    assert out.text() == "hello \ufffd"


def test_stream_decoder_never_splits_a_character() -> None:
    decoder = StreamDecoder()
    data = "grüße".encode()
    parts = [decoder.decode(data[i : i + 1]) for i in range(len(data))]
    assert "".join(parts) + decoder.decode(b"", final=True) == "grüße"


def test_redact_masks_longest_first() -> None:
    assert redact("token=abc123 and abc", ["abc", "abc123"]) == "token=*** and ***"


def test_resolve_within(tmp_path: Path) -> None:
    assert resolve_within(tmp_path, "a/b") == tmp_path / "a" / "b"
    for bad in ("/etc/passwd", "../x", "a/../../x", ""):
        with pytest.raises(ConfigError, match="must be relative"):
            resolve_within(tmp_path, bad)
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(ConfigError, match="symlink"):
        resolve_within(tmp_path, "link/passwd")


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> list[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    raw = buffer.getvalue()
    return [raw[i : i + 700] for i in range(0, len(raw), 700)]


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    "evil",
    [
        _member("/abs.txt"),
        _member("../up.txt"),
        _member("a/../../up.txt"),
        _member("sym", tarfile.SYMTYPE, "/etc/passwd"),
        _member("sym", tarfile.SYMTYPE, "../../etc"),
        _member("hard", tarfile.LNKTYPE, "../outside"),
        _member("dev", tarfile.CHRTYPE),
    ],
)
def test_extract_refuses_members_outside_root(tmp_path: Path, evil: tarfile.TarInfo) -> None:
    chunks = _tar((_member("ok.txt"), b"fine"), (evil, b""))
    with pytest.raises(UnsafeArchiveMember, match="would land outside"):
        extract_tar(chunks, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_extract_strips_the_wrapping_directory(tmp_path: Path) -> None:
    chunks = _tar((_member("wrap", tarfile.DIRTYPE), b""), (_member("wrap/a.txt"), b"a"))
    extract_tar(chunks, tmp_path / "dest", strip="wrap")
    assert (tmp_path / "dest" / "a.txt").read_text() == "a"
    with pytest.raises(UnsafeArchiveMember, match="not under"):
        extract_tar(_tar((_member("elsewhere.txt"), b"x")), tmp_path / "d2", strip="wrap")


def test_pack_then_extract_merges_into_existing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "new.txt").write_text("new")
    (src / "keep.txt").write_text("replaced")
    dest = tmp_path / "dest"
    (dest / "sub").mkdir(parents=True)
    (dest / "keep.txt").write_text("old")
    (dest / "sub" / "other.txt").write_text("other")
    extract_tar(pack_dir(src), dest)
    assert (dest / "keep.txt").read_text() == "replaced"
    assert (dest / "sub" / "new.txt").read_text() == "new"
    assert (dest / "sub" / "other.txt").read_text() == "other"


def test_pack_refuses_escaping_symlinks(tmp_path: Path) -> None:
    (tmp_path / "ok").symlink_to("sibling")
    (tmp_path / "bad").symlink_to("../../outside")
    with pytest.raises(UnsafeArchiveMember, match="'bad'"):
        list(pack_dir(tmp_path))


def test_corral_s_programs_are_packed_root_owned_with_their_modes() -> None:
    data = owned_by_root({"d/prog": (b"\x7fELF", 0o555)}, dirs={"d": 0o700})
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = [(m.name, m.isdir(), m.mode, m.uid, m.gid, m.uname) for m in archive]
        extracted = archive.extractfile("d/prog")
        assert extracted is not None and extracted.read() == b"\x7fELF"
    assert members == [("d", True, 0o700, 0, 0, "root"), ("d/prog", False, 0o555, 0, 0, "root")]
