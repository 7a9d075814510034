"""The learner: one asyncio process, its components in one TaskGroup joined by bounded queues
(orchestrator -> workers -> stream -> consumer -> trainer); torch work runs behind
`asyncio.to_thread`. `run` builds the parts (`build`: a `Learner`, whose methods are the tasks)
and starts them. Slots, staleness and stopping: docs/DESIGN.md#the-rollout-stream-and-the-learner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
import structlog

from evoenv_learner.consumer import RolloutConsumer
from evoenv_learner.distributed import DataParallel
from evoenv_learner.held_out import evaluate
from evoenv_learner.intake import settle_dropped as settle_dropped
from evoenv_learner.intake import settle_read as settle_read
from evoenv_learner.intake import split_quarantined as split_quarantined
from evoenv_learner.intake import split_stale as split_stale
from evoenv_learner.memory import (
    GrowthTrace,
    keep_heap_small,
    peak_rss_gib,
    release_memory,
    reset_peak,
    rss_gib,
)
from evoenv_learner.metrics import MetricsSink
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.outage import LOST, Outage
from evoenv_learner.pool import Pool, seed_pool
from shared.config import Settings
from shared.db import Archive
from shared.errors import EvoEnvError, ServiceUnavailable
from shared.messages import GradedGroup
from shared.pauses import ServingClock
from shared.policy import read_version
from shared.rollouts import EntryCheck
from shared.stream_key import key_id

if TYPE_CHECKING:
    import redis

    from evoenv_learner.publisher import WeightPublisher
    from evoenv_learner.trainer import Trainer

log = structlog.get_logger(__name__)

GroupExpiry = Callable[[Settings, "redis.Redis", Archive], Callable[[str, str], bool]]
"""Given the learner's settings, Redis client and archive: the orchestrator's `expire_group`,
which finalises a generation group the learner stops waiting for as expired (its record
closed, so nothing of it reaches the stream later; its candidates' archive records saying so)
and says whether it did (False: it completed first). The finalising is the workers' code
(`generation.expire_group`), run in the learner's process so that a group expires at its
deadline even when no worker is running; the command passes it (`evoenv_cli/expiry.py`)."""


@dataclass
class LearnerState:
    step: int = 0
    version: int = 0
    stale_dropped: int = 0
    """Groups dropped as stale, where read and at the step."""
    stale_at_step: int = 0
    """Of those, the ones that aged past `max_staleness` while queued for a step."""
    quarantined_dropped: int = 0
    """Solver groups never trained on because the grader saw their environment's scorer
    disagree with itself, or their environment was quarantined: where read and at the step."""
    skipped_groups: int = 0
    funnel: dict[str, int] = field(default_factory=dict)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    stopping: bool = False
    """A stop was asked for: the step in progress is dropped, then a checkpoint is written."""
    tokens: int = 0
    """Completion tokens in the groups read from the stream (trained, skipped or over budget),
    over the whole run (kept in checkpoints)."""
    in_flight: Callable[[], int] = field(default=lambda: 0, repr=False)
    """Solver and generator groups sent and not yet back (the orchestrator's live count)."""

    @property
    def judged(self) -> int:
        """Generated candidates that reached an admission verdict over the whole run: the
        funnel's count, less the candidates of groups that expired."""
        return sum(count for outcome, count in self.funnel.items() if outcome != "expired")


def hangup_handler(then: Callable[[], None]) -> Callable[[], None] | None:
    """A SIGHUP handler: the terminal is gone, so point the standard output and error that
    were on it at /dev/null (each write would fail with EIO, and the first one would end the
    process before it could stop cleanly), then call `then`. None when SIGHUP is ignored (as
    under `nohup`), which it must stay."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return None
    terminals = _terminals()

    def hung_up() -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in terminals:
            os.dup2(devnull, fd)
        os.close(devnull)
        then()

    return hung_up


def _terminals() -> list[int]:
    """Which of the standard output and error are on a terminal (a hung-up one is no tty)."""
    return [fd for fd in (1, 2) if os.isatty(fd)]


def watch_terminal(hung_up: Callable[[], None]) -> Coroutine[Any, Any, None]:
    """Call `hung_up` if the terminal on the standard output or error goes away, then return;
    until then, one check a second, until cancelled. A hung-up terminal is no tty any more, and
    a closed terminal does not always signal us: under `ssh -t host make run` the SIGHUP goes
    to the session's leader, make, which dies and leaves `evoenv up` running on a dead
    terminal. The terminals watched are those of the call, not of the coroutine's first run:
    one that goes away in between still counts."""
    terminals = _terminals()

    async def watch() -> None:
        while terminals:
            if _terminals() != terminals:
                hung_up()
                return
            await asyncio.sleep(1.0)

    return watch()


async def run(
    settings: Settings,
    *,
    resume: bool = False,
    on_step: Any = None,
    on_start: Callable[[LearnerState], None] | None = None,
    republish: asyncio.Event | None = None,
    parallel: DataParallel | None = None,
    expire_groups: GroupExpiry | None = None,
) -> LearnerState:
    """Run the learner until `learner.steps` steps are done (0: until stopped).

    SIGTERM or SIGINT stops it cleanly: no new jobs are sent (jobs in flight finish on the
    workers and wait in the stream), the step in progress is dropped, a checkpoint is written,
    then the stream entries it includes are acknowledged. SIGHUP (its terminal closed) does the
    same, its terminal output going to /dev/null from then on, and so does a terminal that goes
    away without a SIGHUP reaching the learner; under `nohup` hangups stay ignored. With
    `resume`, it continues from the last checkpoint, whose weights are pushed to every server
    as version max(checkpoint, Redis) + 1, so a version number is never reused.

    Every group the orchestrator sent frees its slot whatever becomes of it: read and trained,
    skipped for no reward variance, dropped as stale, malformed or with a reward out of range
    where read (`intake.py`: `settle_read`, `settle_dropped`); a chain or proposal that fails
    or is lost is the orchestrator's to reap. Staleness (`learner.max_staleness`: versions
    between the policy that sampled a completion and the step that trains on it) is checked
    where a group is read and again at the step that would use it (`intake.split_stale`): a
    group that aged past it while queued is dropped there, counted (`stale_at_step`) and
    logged. A solver group the grader marked `dishonest` quarantines its environment, and no
    group of a quarantined environment is trained on: dropped where read and at the step
    (`intake.split_quarantined`), counted (`quarantined_dropped`) and logged. An entry
    without a valid signature frees no slot (`consumer.RolloutConsumer`).

    `on_start` gets the learner's state once it runs (the model loaded, the checkpoint
    resumed); the loop updates that object in place from then on. `on_step` gets it after
    each step and when a stop is asked for.

    Setting `republish` (e.g. when a model server was restarted, and serves the base weights
    again) pushes the current weights as a new version as soon as no step is running.

    With `parallel` (rank 0 of a torchrun group, see `distributed.py`), the other ranks train
    beside this one: they get the model folder here and the steps through the trainer.

    `expire_groups` gives the orchestrator its `expire_group` (see `GroupExpiry`); without it
    a generation group past its deadline only frees its slot, as a warning says at start."""
    keep_heap_small()  # before the model is loaded (`memory.keep_heap_small`)
    learner = await build(
        settings,
        resume=resume,
        on_step=on_step,
        republish=republish,
        parallel=parallel,
        expire_groups=expire_groups,
    )
    state = learner.state
    hung_up = learner.handle_signals()
    log.info(
        "learner_started",
        run=settings.run,
        model=str(learner.model_path),
        step=state.step,
        version=state.version,
        stream_key_id=key_id(learner.consumer.check.key),
        settings=settings.masked(),
    )
    if on_start is not None:
        on_start(state)
    # beside the group, not in it: it watches until the stop's checkpoint is written too
    watcher = asyncio.create_task(watch_terminal(hung_up)) if hung_up is not None else None
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(learner.orchestrator.run(learner.stop))
            group.create_task(learner.orchestrator.search_serving(learner.stop))
            group.create_task(learner.consume())
            group.create_task(learner.train())
            if republish is not None:
                group.create_task(learner.republisher())
    except BaseExceptionGroup as failed:  # a deliberate error (DiskFull, ...) as itself
        ours = failed.subgroup(EvoEnvError)
        if ours is None:
            raise
        first: BaseException = ours
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from failed
    finally:
        if watcher is not None:
            watcher.cancel()
        await learner.close()
    log.info("learner_stopped", step=state.step, version=state.version, funnel=state.funnel)
    return state


async def build(
    settings: Settings,
    *,
    resume: bool,
    on_step: Any,
    republish: asyncio.Event | None,
    parallel: DataParallel | None,
    expire_groups: GroupExpiry | None,
) -> Learner:
    """The learner's parts (`run`'s arguments of the same names): the pool seeded, the model
    prepared (and sent to the ranks beside this one), the trainer and publisher on it, the last
    checkpoint resumed if asked, the consumer started, the orchestrator on its clock."""
    from evoenv_learner import jobs
    from evoenv_learner.publisher import make_publisher
    from evoenv_learner.trainer import Trainer
    from evoenv_model.models import prepare_model
    from shared.redis_client import connect

    jobs.configure(settings)
    run_dir = settings.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    check = EntryCheck.of(settings)  # the stream key: a missing one is an error before the model
    archive = Archive(settings.archive_url)
    await asyncio.to_thread(seed_pool, archive, settings.seeds_dir)
    pool = Pool(archive, settings.pool)
    sync_redis = connect(settings, check=True)
    client = aioredis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=settings.worker.connect_timeout
    )
    model_path = await asyncio.to_thread(prepare_model, settings)
    if parallel is not None:
        parallel.broadcast(str(model_path))  # the followers build their replicas from it
    trainer = await asyncio.to_thread(
        Trainer,
        model_path,
        settings.grpo,
        device=parallel.device if parallel else None,
        parallel=parallel,
    )
    publisher = await asyncio.to_thread(
        make_publisher,
        settings,
        sync_redis,
        trainer.model,
        run_dir / "weights",
        model_path,
        sharded=parallel is not None,
    )
    state = LearnerState(version=read_version(sync_redis))
    take_turns = settings.learner.take_turns
    if take_turns is None:  # on a CPU, generation and training share the cores
        take_turns = next(trainer.model.parameters()).device.type == "cpu"
    extra = await _resume(settings, trainer, publisher, sync_redis, state) if resume else {}
    consumer = RolloutConsumer(
        client, settings.run, "learner", settings.learner.max_staleness, check
    )
    await consumer.start(list(extra.get("unacked", [])), held=list(extra.get("held", [])))
    rng = random.Random(extra.get("orchestrator_seed", time.time_ns()))
    orchestrator = Orchestrator(
        settings,
        pool,
        consumer.backlog,
        rng=rng,
        expire_group=_group_expiry(settings, expire_groups, sync_redis, archive),
        funnel=state.funnel,
        clock=ServingClock(sync_redis),
    )
    state.in_flight = orchestrator.groups_in_flight
    orchestrator.levels.update({str(k): int(v) for k, v in extra.get("levels", {}).items()})
    orchestrator.spread.update({str(k): list(v) for k, v in extra.get("spread", {}).items()})
    return Learner(
        settings=settings,
        state=state,
        pool=pool,
        sync_redis=sync_redis,
        client=client,
        model_path=model_path,
        trainer=trainer,
        publisher=publisher,
        take_turns=take_turns,
        consumer=consumer,
        rng=rng,
        orchestrator=orchestrator,
        metrics=MetricsSink(settings, archive, run_dir / "tensorboard"),
        on_step=on_step,
        republish=republish,
        queue=asyncio.Queue(maxsize=settings.grpo.batch_groups * 4),
    )


def _group_expiry(
    settings: Settings,
    expire_groups: GroupExpiry | None,
    sync_redis: redis.Redis,
    archive: Archive,
) -> Callable[[str, str], bool] | None:
    """The orchestrator's `expire_group` from `expire_groups`; None without it, and then, if
    generation groups are to be sent, one warning: the learner cannot import the workers' code
    that expires a group (`python -m evoenv_learner` starts it so)."""
    if expire_groups is not None:
        return expire_groups(settings, sync_redis, archive)
    if settings.learner.generator_groups_in_flight and not settings.learner.synchronous:
        log.warning(
            "group_expiry_missing",
            detail="started without the workers' expire_group: a generation group that cannot "
            "arrive only has its slot freed (its record stays open and its candidates' archive "
            "records do not say it expired); `evoenv learner` runs the full learner",
        )
    return None


async def _resume(
    settings: Settings,
    trainer: Trainer,
    publisher: WeightPublisher,
    sync_redis: redis.Redis,
    state: LearnerState,
) -> dict[str, Any]:
    """The last checkpoint loaded into `trainer` and `state`, its weights pushed as version
    max(checkpoint, Redis) + 1; what else it holds (empty if there is none)."""
    from evoenv_learner.checkpoints import latest_checkpoint

    run_dir = settings.run_dir
    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        log.warning(
            "no_checkpoint",
            detail=f"nothing to resume in {run_dir / 'checkpoints'}; starting fresh",
        )
        return {}
    extra: dict[str, Any] = await asyncio.to_thread(trainer.load_checkpoint, latest)
    state.step = trainer.step_count
    state.funnel = dict(extra.get("funnel", {}))
    state.tokens = int(extra.get("tokens", 0))
    target = max(int(extra.get("version", 0)), read_version(sync_redis)) + 1
    state.version = await asyncio.to_thread(
        lambda: publisher.publish(trainer.weights_for_push(), target)
    )
    log.info("learner_resumed", checkpoint=str(latest), step=state.step, version=state.version)
    return extra


@dataclass
class Learner:
    """The learner's parts, built by `build`; its methods are the tasks `run` starts beside
    the orchestrator's (`consume`, `train`, `republisher`), what they share, and stopping."""

    settings: Settings
    state: LearnerState
    pool: Pool
    sync_redis: redis.Redis
    client: aioredis.Redis
    model_path: Path
    trainer: Trainer
    publisher: WeightPublisher
    take_turns: bool
    consumer: RolloutConsumer
    rng: random.Random
    orchestrator: Orchestrator
    metrics: MetricsSink
    on_step: Any
    republish: asyncio.Event | None
    queue: asyncio.Queue[GradedGroup]
    """Groups read and settled, waiting for a step."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    weights: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the trainer steps or a push reads the weights."""
    _carry: list[GradedGroup] = field(default_factory=list, init=False)
    """The fresh part of a batch that lost stale groups."""
    _push_owed: bool = field(default=False, init=False)
    """The last push due failed: push again at the next step."""
    _last_checkpoint: int = field(default=0, init=False)
    """The step of the last checkpoint written (or resumed)."""
    _trace: GrowthTrace | None = field(default=None, init=False)
    """Started at the first step when `learner.trace_memory_every` is on."""

    def request_stop(self) -> None:  # on a CPU a step takes minutes: say what the wait is for
        if not self.state.stopping:
            self.state.stopping = True
            log.info("learner_stopping", step=self.state.step, then="checkpoint")
            self.trainer.interrupt.set()
            if self.on_step is not None:
                self.on_step(self.state)
        self.stop.set()

    def handle_signals(self) -> Callable[[], None] | None:
        """SIGTERM and SIGINT ask for a stop, and so does SIGHUP unless it is ignored (see
        `hangup_handler`, returned: None when ignored)."""
        handlers = {signal.SIGTERM: self.request_stop, signal.SIGINT: self.request_stop}
        hung_up = hangup_handler(self.request_stop)
        if hung_up is not None:
            handlers[signal.SIGHUP] = hung_up
        loop = asyncio.get_running_loop()
        for sig, handler in handlers.items():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, handler)
        return hung_up

    async def checkpoint(self) -> None:
        ids = self.consumer.take_for_checkpoint()
        extra = {
            "version": self.state.version,
            "unacked": ids,
            "held": self.consumer.held(),  # read, counted, not yet trained: read again on resume
            "funnel": self.state.funnel,
            "tokens": self.state.tokens,
            "orchestrator_seed": self.rng.random(),
            "levels": self.orchestrator.levels,
            "spread": self.orchestrator.spread,
        }
        await asyncio.to_thread(
            self.trainer.save_checkpoint,
            self.settings.run_dir / "checkpoints",
            extra,
            keep=self.settings.learner.keep_checkpoints,
        )
        await asyncio.to_thread(release_memory)
        await self.consumer.acknowledge(ids)

    async def consume(self) -> None:
        """Groups from the stream settled (`intake`) and the trainable ones queued; a lost
        Redis is waited for (`outage.Outage`)."""
        state, consumer = self.state, self.consumer
        outage = Outage("stream")
        while not self.stop.is_set():
            try:
                groups = await consumer.read(self.settings.grpo.batch_groups, 1000, state.version)
            except LOST as exc:
                await outage.failed(exc)
                continue
            outage.ok()
            state.stale_dropped = consumer.stats.stale + state.stale_at_step
            settle_dropped(consumer.take_dropped(), self.orchestrator, state.funnel)
            for group in groups:
                log.info("group_read", group=group.group_id, role=group.role)
                if consumer.settled(group) or await settle_read(
                    group, self.orchestrator, self.pool, state, self.settings
                ):
                    await _put(self.queue, group, self.stop)
                else:
                    consumer.done([group])  # skipped: nothing to learn from

    async def push(self) -> float | None:
        """Publish the weights as a new version; the seconds it took, None if it failed."""
        from evoenv_learner.publisher import PushFailed

        republish = self.republish
        started = time.perf_counter()
        owed = republish is not None and republish.is_set()  # this push settles that debt
        try:
            self.state.version = await asyncio.to_thread(
                lambda: self.publisher.publish(self.trainer.weights_for_push())
            )
            if owed:
                republish.clear()  # type: ignore[union-attr]
        except (PushFailed, ServiceUnavailable) as exc:
            # A server down (being restarted): train on, push again next step.
            log.error("push_failed_will_retry", step=self.state.step, error=str(exc)[:500])
            return None
        return round(time.perf_counter() - started, 3)

    async def republisher(self) -> None:
        republish = self.republish
        assert republish is not None
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(republish.wait(), timeout=1.0)
            if republish.is_set() and not self.stop.is_set():
                async with self.weights:
                    if not republish.is_set():
                        continue  # a step's push reached every server meanwhile
                    log.info("republish", step=self.state.step, version=self.state.version)
                    if await self.push() is None:
                        await asyncio.sleep(5.0)  # still owed: try again

    async def train(self) -> None:
        """Steps until `learner.steps` are done (0: until stopped), then the stop; a checkpoint
        at the end if anything was trained or read since the last one."""
        from evoenv_learner.trainer import StepInterrupted

        state, settings = self.state, self.settings
        self._last_checkpoint = state.step
        try:
            if settings.learner.eval_at_start and state.step == 0:
                await self.evaluate()  # the starting policy, at step 0
            while not self.stop.is_set() and (
                not settings.learner.steps or state.step < settings.learner.steps
            ):
                batch = await _batch(self.queue, settings.grpo.batch_groups, self.stop, self._carry)
                if not batch:
                    continue
                try:
                    values = await self._one_step(batch)
                except StepInterrupted:
                    # its groups, like those still queued, stay pending: the stop's
                    # checkpoint holds them as read and counted, and a resumed learner
                    # trains them
                    log.info("step_abandoned", step=state.step + 1, groups=len(batch))
                    break
                if values is not None:
                    await self._after_step(values, batch)
        finally:
            self.stop.set()
            if state.step > self._last_checkpoint or self.consumer.has_unacknowledged:
                await self.checkpoint()

    async def _one_step(self, batch: list[GradedGroup]) -> dict[str, Any] | None:
        """A step on `batch`, then a push when due; the step's metrics. None when no step was
        taken: the batch had stale groups or groups of an environment quarantined since they were
        read (the others wait, topped up, for the next try), or the trainer took none. `StepInterrupted` when a stop abandoned it."""
        state = self.state
        async with self.weights:  # no push can bump the version from here to the step
            fresh, stale = split_stale(
                batch, state.version, self.settings.learner.max_staleness, state.step + 1
            )
            fresh, barred = split_quarantined(fresh, self.pool, state.step + 1)
            if stale or barred:
                self.consumer.done([*stale, *barred])
                state.stale_at_step += len(stale)
                state.stale_dropped = self.consumer.stats.stale + state.stale_at_step
                state.quarantined_dropped += len(barred)
                self.orchestrator.dropped_at_step(len(stale) + len(barred))
                self._carry = fresh  # topped up from the queue, then checked again
                return None
            self._carry = []
            async with taking_turns(self.publisher, self.take_turns):
                step_metrics = await asyncio.to_thread(self.trainer.step, batch)
                taken = self.trainer.step_count != state.step
                due = taken and (
                    self.trainer.step_count % self.settings.learner.push_every == 0
                    or self._push_owed
                )
                # A push that pauses nothing (an adapter) goes while the servers are held: see
                # `AdapterPublisher`. One that pauses them goes after the release.
                early = due and not self.publisher.pauses_servers
                early_seconds = await self.push() if early else None
            self.consumer.done(batch)
            if not taken:
                log.warning("step_not_taken", groups=len(batch))
                self.orchestrator.batch_trained()
                return None
            state.step = self.trainer.step_count
            values = step_metrics.as_dict()
            values["groups_trained"] = [g.group_id for g in batch]
            if due:
                seconds = early_seconds if early else await self.push()
                self._push_owed = seconds is None
                if seconds is not None:
                    values["push_seconds"] = seconds
            # the highest resident size since the last step's reading: this step, its push,
            # and the checkpoint and evaluation after the last step (a reading after the
            # release below misses the step's peak by gigabytes)
            values["peak_rss_gib"] = round(peak_rss_gib(), 2)
            reset_peak()
            await asyncio.to_thread(release_memory)
            values["rss_gib"] = round(rss_gib(), 2)
        return values

    async def _after_step(self, values: dict[str, Any], batch: list[GradedGroup]) -> None:
        """The step's metrics, with the learner's counters, and its samples of `batch`
        recorded, and the metrics passed to `on_step`; a checkpoint and an evaluation when due;
        then the orchestrator told."""
        state, orchestrator = self.state, self.orchestrator
        values.update(
            version=state.version,
            zero_variance_skipped=state.skipped_groups,
            stale_dropped=state.stale_dropped,
            stale_at_step=state.stale_at_step,
            forged_dropped=self.consumer.stats.forged,
            quarantined_dropped=state.quarantined_dropped,
            out_of_range_dropped=self.consumer.stats.out_of_range,
            in_flight_solver=len(orchestrator.solver_in_flight),
            in_flight_generator=len(orchestrator.generator_in_flight),
            queue=self.queue.qsize(),
            pool=len(self.pool),
            **{f"funnel_{k}": v for k, v in state.funnel.items()},
        )
        state.last_metrics = values
        await asyncio.to_thread(self.metrics.train, state.step, state.version, values)
        await asyncio.to_thread(self.metrics.samples, state.step, state.version, batch)
        if self.on_step is not None:
            self.on_step(state)
        every = self.settings.learner.trace_memory_every
        if every and self._trace is None:
            self._trace = GrowthTrace()
        elif every and self._trace is not None and state.step % every == 0:
            lines = await asyncio.to_thread(self._trace.growth)
            log.info("memory_growth", step=state.step, rss_gib=round(rss_gib(), 2), lines=lines)
        if state.step % self.settings.learner.checkpoint_every == 0:
            await self.checkpoint()
            self._last_checkpoint = state.step
        if state.step % self.settings.learner.eval_every == 0:
            await self.evaluate()
        orchestrator.batch_trained()  # synchronous mode: its next round starts

    async def evaluate(self) -> None:
        """The served policy on held-out instances, beside the best constant answer on the
        same instances (`held_out.evaluate`), recorded at the current step."""
        state = self.state
        result = await evaluate(self.settings, self.orchestrator.solvers, self.stop, baseline=True)
        await asyncio.to_thread(self.metrics.eval, state.step, state.version, result)

    async def close(self) -> None:
        """Close what the learner opened: the trainer (and the ranks beside it), the metrics,
        the publisher, the Redis clients; the jobs' results still held are let go first."""
        self.orchestrator.forget()
        await asyncio.to_thread(self.trainer.close)
        self.metrics.close()
        self.publisher.close()
        await self.client.aclose()
        self.sync_redis.close()


@asynccontextmanager
async def taking_turns(publisher: WeightPublisher, enabled: bool) -> AsyncIterator[None]:
    """With `enabled`, the model servers are paused (keep mode) for the block: on a machine
    without a GPU the step then has every core instead of sharing them with generation, which
    waits where it is and goes on after the step (`learner.take_turns`)."""
    if not enabled:
        yield
        return
    held = await asyncio.to_thread(publisher.hold)
    try:
        yield
    finally:
        await asyncio.to_thread(publisher.release, held)


def run_process(
    settings: Settings,
    *,
    resume: bool = False,
    expire_groups: GroupExpiry | None = None,
    on_start: Callable[[LearnerState], None] | None = None,
    on_step: Callable[[LearnerState], None] | None = None,
) -> LearnerState | None:
    """This process's part of the learner: all of it in one process, or, when started by
    torchrun on several devices, rank 0's (all of it, its steps shared) or a follower's (None
    is returned when rank 0 says stop). `expire_groups`, `on_start`, `on_step`: as for `run`.
    SIGUSR1 asks for the current weights to be pushed again (`run`'s `republish`)."""
    from evoenv_learner.distributed import follow

    parallel = DataParallel.from_env()
    if parallel is not None and not parallel.leader:
        follow(settings, parallel)
        return None

    async def main() -> LearnerState:
        republish = asyncio.Event()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, republish.set)
        return await run(
            settings,
            resume=resume,
            on_step=on_step,
            on_start=on_start,
            republish=republish,
            parallel=parallel,
            expire_groups=expire_groups,
        )

    return asyncio.run(main())


async def _put(queue: asyncio.Queue[GradedGroup], group: GradedGroup, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(queue.put(group), timeout=1.0)
            return
        except TimeoutError:
            continue


async def _batch(
    queue: asyncio.Queue[GradedGroup],
    size: int,
    stop: asyncio.Event,
    carry: Sequence[GradedGroup] = (),
) -> list[GradedGroup]:
    """`carry` topped up to `size` groups from the queue; none if the learner is stopping."""
    batch = list(carry)
    while len(batch) < size and not stop.is_set():
        try:
            batch.append(await asyncio.wait_for(queue.get(), timeout=1.0))
        except TimeoutError:
            continue
    return batch if len(batch) == size else []


def export(settings: Settings, folder: Path) -> Path:
    """The policy of the run's last checkpoint as a Hugging Face folder (a LoRA run's adapter
    merged into the base weights; the checkpoint says which mode it was trained in)."""
    from evoenv_learner.checkpoints import STATE_FILE, latest_checkpoint
    from evoenv_learner.lora import settings_of
    from evoenv_learner.trainer import Trainer
    from evoenv_model.models import prepare_model
    from shared.errors import UsageError

    latest = latest_checkpoint(settings.run_dir / "checkpoints")
    if latest is None:
        raise UsageError(f"no checkpoint in {settings.run_dir / 'checkpoints'}: train first")
    state = json.loads((latest / STATE_FILE).read_text())
    trainer = Trainer(prepare_model(settings), settings_of(state, settings.grpo))
    trainer.load_checkpoint(latest)
    return trainer.export_hf(folder)
