"""Turn-taking: while the trainer steps, the model servers are held (paused in keep mode) and
released after the step, whatever happens in it; off, nothing is paused."""

from __future__ import annotations

import asyncio

import pytest

from evoenv_learner.loop import taking_turns


class Servers:
    """A publisher's hold and release, recorded."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def hold(self) -> list[str]:
        self.events.append("hold")
        return ["http://a"]

    def release(self, held: list[str]) -> None:
        self.events.append(f"release {held}")


async def step(servers: Servers, enabled: bool, fail: bool = False) -> None:
    async with taking_turns(servers, enabled):  # type: ignore[arg-type]
        servers.events.append("step")
        if fail:
            raise RuntimeError("the step failed")


def test_the_servers_are_held_for_the_step_and_released_after_it() -> None:
    servers = Servers()
    asyncio.run(step(servers, enabled=True))
    assert servers.events == ["hold", "step", "release ['http://a']"]


def test_the_servers_are_released_when_the_step_fails() -> None:
    servers = Servers()
    with pytest.raises(RuntimeError):
        asyncio.run(step(servers, enabled=True, fail=True))
    assert servers.events == ["hold", "step", "release ['http://a']"]


def test_off_nothing_is_paused() -> None:
    servers = Servers()
    asyncio.run(step(servers, enabled=False))
    assert servers.events == ["step"]
