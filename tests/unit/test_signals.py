"""`cancelled_on_signals`: a signal cancels the block (its cleanup runs), nothing else
changes how the block ends."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from corral.signals import cancelled_on_signals

pytestmark = pytest.mark.anyio


async def test_a_signal_cancels_the_block_and_its_cleanup_runs() -> None:
    cleaned: list[str] = []
    async with cancelled_on_signals() as caught:
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            await anyio.sleep(5)
            cleaned.append("not reached")
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.01)
                cleaned.append("cleanup")
    assert caught.signum == signal.SIGHUP
    assert caught.exit_code == 128 + signal.SIGHUP
    assert cleaned == ["cleanup"]


async def test_a_block_that_ends_normally_caught_nothing() -> None:
    async with cancelled_on_signals(signal.SIGTERM) as caught:
        await anyio.sleep(0.01)
    assert caught.signum is None and caught.exit_code is None


async def test_an_error_in_the_block_reaches_the_caller_as_itself() -> None:
    with pytest.raises(KeyError, match="the block's own"):
        async with cancelled_on_signals():
            raise KeyError("the block's own")


async def test_a_cancellation_from_outside_goes_on_out() -> None:
    seen: list[int | None] = []
    with anyio.move_on_after(0.05) as outer:
        async with cancelled_on_signals() as caught:
            try:
                await anyio.sleep(5)
            finally:
                seen.append(caught.signum)
    assert outer.cancelled_caught and seen == [None]
