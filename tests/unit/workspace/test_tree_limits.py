"""Transfer limits hold while the archive streams: refused at the first entry or byte over,
before the rest is read, with the destination left as it was."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral.core.tarsafe import extract_tar
from corral.core.treelimits import TreeLimits, bounded
from corral.errors import TransferLimitExceeded
from tests.hostile import DIR, FILE, crafted_tar

CHUNK = 4096


class Stream:
    """An archive in chunks that counts how many were asked for."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.read = 0

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), CHUNK):
            self.read += 1
            yield self.data[start : start + CHUNK]

    @property
    def chunks(self) -> int:
        return -(-len(self.data) // CHUNK)


def _files(count: int, size: int) -> bytes:
    return crafted_tar(
        [("d", DIR, "", b""), *((f"d/f{i}", FILE, "", b"x" * size) for i in range(count))]
    )


@pytest.mark.parametrize(
    ("limits", "data", "message"),
    [
        (TreeLimits(max_files=10), _files(200, 10), "more than max_files=10"),
        (TreeLimits(max_file_bytes=1000), _files(50, 5000), "over max_file_bytes=1000"),
        (TreeLimits(max_total_bytes=50_000), _files(100, 5000), "more than max_total_bytes=50000"),
        (TreeLimits(max_archive_bytes=40_000), _files(100, 5000), "more than max_archive_bytes"),
    ],
    ids=["files", "file-bytes", "total-bytes", "archive-bytes"],
)
def test_refused_mid_stream_leaving_the_destination_as_it_was(
    tmp_path: Path, limits: TreeLimits, data: bytes, message: str
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "kept").write_text("before")
    stream = Stream(data)
    with bounded(limits), pytest.raises(TransferLimitExceeded, match=message):
        extract_tar(stream, dest)
    assert stream.read < stream.chunks / 2, "the archive was read to its end before refusing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]  # no staging left
    assert [p.name for p in dest.iterdir()] == ["kept"]


def test_a_header_claiming_gigabytes_is_refused_without_buffering_it(tmp_path: Path) -> None:
    """A pax header's size is read into memory whole; the archive bound stops it first."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = 4 << 30
    endless = Stream(header.tobuf(format=tarfile.USTAR_FORMAT) + b"0" * (64 << 20))
    with bounded(TreeLimits(max_archive_bytes=1 << 20)), pytest.raises(TransferLimitExceeded):
        extract_tar(endless, tmp_path / "dest")
    assert endless.read * CHUNK <= (1 << 20) + 2 * CHUNK
    assert not (tmp_path / "dest").exists()


def test_within_limits_and_outside_a_bound_block_nothing_changes(tmp_path: Path) -> None:
    data = _files(20, 100)
    with bounded(TreeLimits(max_files=21, max_file_bytes=100, max_total_bytes=2000)):
        extract_tar(Stream(data), tmp_path / "in")
    extract_tar(Stream(_files(20_000, 0)), tmp_path / "unbounded")
    assert len(list((tmp_path / "in" / "d").iterdir())) == 20
    assert len(list((tmp_path / "unbounded" / "d").iterdir())) == 20_000


def test_limits_reach_the_worker_thread_a_provider_extracts_in(tmp_path: Path) -> None:
    async def download() -> None:
        with bounded(TreeLimits(max_files=3)):
            await anyio.to_thread.run_sync(extract_tar, Stream(_files(10, 1)), tmp_path / "d")

    with pytest.raises(TransferLimitExceeded):
        anyio.run(download)


def test_bad_limits_name_the_value() -> None:
    with pytest.raises(ValueError, match="max_files"):
        TreeLimits(max_files=0)
