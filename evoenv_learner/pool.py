"""The pool: the environments the solver is trained on, backed by the archive.

Members are the archive's environments with status `seed` or `admitted`; `Pool` keeps them in
memory for sampling, with the seeds' floor, rotation and quarantine
(docs/DESIGN.md#solver-groups, docs/CONTRACT.md#grades).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlmodel import select

from shared.config import PoolSettings
from shared.db import Archive, EnvironmentRow, utcnow
from shared.env_stats import DifficultySearch, EnvStats, Quarantine, Retirement, Served
from shared.errors import PoolEmpty, UsageError
from shared.messages import EnvRef
from shared.static import check_static

log = structlog.get_logger(__name__)

ACTIVE_STATUSES = ("seed", "admitted")
HISTORY_LIMIT = 50
SEED_ORIGIN = "seed"
SOLVE_RATE_MIN_SCORED = 8
"""Graded answers before an environment's solve rate counts as known."""
RECENT_GROUPS = 256
"""Group ids remembered per environment against counting a replayed group twice: more than
the groups read between two checkpoints."""


@dataclass(frozen=True, slots=True)
class PoolEntry:
    """One active member, as the orchestrator needs it to schedule a solver group."""

    sha: str
    name: str
    source: str
    origin: str
    """seed, generated or user."""
    difficulty: int | None
    """The serving difficulty; before any search, the calibration difficulty if recorded;
    None when neither is known (serve at the middle of the environment's range)."""
    searched: bool = False
    """Whether a serving-difficulty search has set `difficulty` (see `difficulty.py`)."""
    solve_rate: float | None = None
    """Share of the solver's graded answers that scored 1.0, over every level served; None
    until `SOLVE_RATE_MIN_SCORED` answers were graded."""

    @property
    def is_seed(self) -> bool:
        return self.origin == SEED_ORIGIN

    def ref(self) -> EnvRef:
        return EnvRef(name=self.name, sha=self.sha, source=self.source)


class Pool:
    """The active environments, with the seed floor, rotation and quarantine.

    Members are the archive's environments with status `seed` or `admitted`. The pool keeps them
    in memory for sampling and re-reads the archive every `refresh_seconds` (or on `refresh()`),
    so environments admitted by other processes join it; every state change it makes itself is
    written to the archive first, in one transaction, and then applied to its memory.

    Sampling (`choose`) keeps the seeds' floor: with probability `seed_share` the draw is a seed,
    uniformly; otherwise it is uniform over every active member, seeds included. The seeds' share
    is then seed_share + (1 - seed_share) x S / N (S seeds among N members), never below
    seed_share whatever the pool's size, and exactly 1 when only seeds are left. With no seeds
    the draw is uniform over the members. Given a `weight`, each of the two draws is in
    proportion to it instead of uniform (the floor holds all the same).

    Rotation (`record_use`): an epoch of use is `epoch_instances` instances served (one solver
    group is one instance); an admitted environment retires once it has been used for
    `retire_after_epochs` epochs. Seeds never retire.

    Quarantine (`record_gradings`): once an admitted environment has `quarantine_min_gradings`
    gradings, an `env_error` rate above `quarantine_error_rate` sets its status to `quarantined`,
    flags it in its stats and logs `env_quarantined`. Seeds are never quarantined (that would
    break the floor); their env_errors are logged as `seed_env_errors`, a bug to look into. An
    admitted environment whose scorer disagreed with itself on a graded group (a hidden probe
    or a re-score: `record_dishonest`) is quarantined at once, its reason `dishonest: ...`; a
    seed's disagreement is logged as `seed_dishonest`. `quarantined` says which environments
    are quarantined (the archive's, as of the last refresh, and those quarantined since).

    What the pool keeps in an environment's stats (`EnvStats`, `shared/env_stats.py`; the other
    fields, such as the admission's calibration figures, are left as they are):

        uses                 instances served
        epochs               whole epochs of use (uses // epoch_instances)
        gradings, env_errors graded completions, and how many of them were env_error
        served               {difficulty: Served(scored, passes)}: non-env_error gradings and
                             full-score ones per difficulty, when the caller reports them
        recent_groups        the last RECENT_GROUPS solver groups counted
        serving_difficulty   the level the solver is served at (see `difficulty.py`)
        serving_curve        {level: pass rate} of the last serving-difficulty search
        pass_rate_history    the searches, oldest first: DifficultySearch(at, level, curve)
                             (the last 50)
        retired, quarantine  why and when the status changed

    Every update is a read-modify-write of one row in one transaction (`BEGIN IMMEDIATE` on
    SQLite, `SELECT ... FOR UPDATE` on PostgreSQL), so concurrent writers lose no count. The
    methods block on the database: the asyncio learner calls them through `asyncio.to_thread`.
    """

    def __init__(
        self,
        archive: Archive,
        settings: PoolSettings,
        *,
        refresh_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.archive = archive
        self.settings = settings
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._members: dict[str, PoolEntry] = {}
        self._seeds: list[PoolEntry] = []
        self._everyone: list[PoolEntry] = []
        self._quarantined: set[str] = set()
        self._loaded_at = 0.0
        self.refresh()

    # ------------------------------------------------------------------ membership

    def refresh(self) -> None:
        """Re-read the active members from the archive."""
        with self.archive.session() as session:
            query = select(EnvironmentRow).where(
                EnvironmentRow.status.in_(ACTIVE_STATUSES)  # type: ignore[attr-defined]
            )
            rows = list(session.exec(query.order_by(EnvironmentRow.created_at)))  # type: ignore[arg-type]
            self._members = {row.sha: _entry(row) for row in rows}
            barred = select(EnvironmentRow.sha).where(EnvironmentRow.status == "quarantined")
            self._quarantined = set(session.exec(barred))
        self._reindex()
        self._loaded_at = self._clock()

    @property
    def members(self) -> list[PoolEntry]:
        """Every active member, seeds first, each group in order of admission."""
        return list(self._everyone)

    @property
    def seeds(self) -> list[PoolEntry]:
        return list(self._seeds)

    def __len__(self) -> int:
        return len(self._everyone)

    def __contains__(self, sha: object) -> bool:
        return sha in self._members

    def quarantined(self, sha: str) -> bool:
        """Whether the environment is quarantined: its groups are not trained on."""
        return sha in self._quarantined

    def choose(
        self, rng: random.Random, weight: Callable[[PoolEntry], float] | None = None
    ) -> PoolEntry:
        """Draw the environment of the next solver group, keeping the seeds' floor; in
        proportion to `weight` (positive) within each draw when given, else uniformly."""
        if self._clock() - self._loaded_at >= self.refresh_seconds:
            self.refresh()
        if not self._everyone:
            raise PoolEmpty("the pool has no seed or admitted environment; record the seeds first")
        if self._seeds and rng.random() < self.settings.seed_share:
            return draw(self._seeds, rng, weight)
        return draw(self._everyone, rng, weight)

    # ------------------------------------------------------------------ updates

    def record_use(self, sha: str, instances: int = 1) -> str:
        """Count `instances` served; retire an admitted environment after its last epoch.

        Returns the environment's status afterwards.
        """
        if instances < 0:
            raise ValueError(f"instances must be 0 or more, got {instances}")
        limit = self.settings.retire_after_epochs

        def change(stats: EnvStats, status: str, origin: str) -> str:
            stats.uses += instances
            stats.epochs = stats.uses // self.settings.epoch_instances
            if status == "admitted" and origin != SEED_ORIGIN and stats.epochs >= limit:
                stats.retired = Retirement(reason="rotation", epochs=stats.epochs, at=_now())
                return "retired"
            return status

        before, after, stats, name = self._update(sha, change)
        if after == "retired" and before != "retired":
            log.info("env_retired", env_sha=sha, env=name, reason="rotation", epochs=stats.epochs)
        return after

    def record_gradings(
        self,
        sha: str,
        n: int,
        env_errors: int,
        *,
        passes: int | None = None,
        difficulty: int | None = None,
        group_id: str | None = None,
    ) -> str:
        """Count `n` gradings of which `env_errors` were env_error; quarantine if too many.

        With `passes` (gradings that scored exactly 1.0) and `difficulty`, the per-difficulty
        pass counts are kept too. With `group_id`, a group already counted (read again from
        the stream after the learner restarted from a checkpoint older than the count) is not
        counted twice: the last RECENT_GROUPS group ids are kept per environment. Returns the
        environment's status afterwards.
        """
        if not 0 <= env_errors <= n:
            raise ValueError(f"env_errors must be in [0, n={n}], got {env_errors}")
        settings = self.settings

        def change(stats: EnvStats, status: str, origin: str) -> str:
            if group_id is not None:
                if group_id in stats.recent_groups:
                    return status
                stats.recent_groups = [*stats.recent_groups, group_id][-RECENT_GROUPS:]
            stats.gradings += n
            stats.env_errors += env_errors
            if passes is not None and difficulty is not None:
                level = stats.served.get(str(difficulty), Served(scored=0, passes=0))
                stats.served = {
                    **stats.served,
                    str(difficulty): Served(
                        scored=level.scored + n - env_errors, passes=level.passes + passes
                    ),
                }
            gradings, errors = stats.gradings, stats.env_errors
            too_many = (
                gradings >= settings.quarantine_min_gradings
                and errors / gradings > settings.quarantine_error_rate
            )
            if too_many and status == "admitted" and origin != SEED_ORIGIN:
                stats.quarantine = Quarantine(
                    reason="env_error rate",
                    gradings=gradings,
                    env_errors=errors,
                    rate=errors / gradings,
                    threshold=settings.quarantine_error_rate,
                    at=_now(),
                )
                return "quarantined"
            return status

        before, after, stats, name = self._update(sha, change)
        if after == "quarantined" and before != "quarantined":
            log.warning(
                "env_quarantined",
                env_sha=sha,
                env=name,
                gradings=stats.gradings,
                env_errors=stats.env_errors,
                threshold=settings.quarantine_error_rate,
            )
        elif env_errors and after == "seed":
            log.warning(
                "seed_env_errors",
                env_sha=sha,
                env=name,
                env_errors=env_errors,
                total_env_errors=stats.env_errors,
            )
        return after

    def record_dishonest(self, sha: str, why: str) -> str:
        """Quarantine an admitted environment whose scorer disagreed with itself on a graded
        group (`why`: what the grader saw); a seed is not quarantined but logged. Returns the
        environment's status afterwards."""

        def change(stats: EnvStats, status: str, origin: str) -> str:
            if status != "admitted" or origin == SEED_ORIGIN:
                return status
            gradings, errors = stats.gradings, stats.env_errors
            stats.quarantine = Quarantine(
                reason=f"dishonest: {why}"[:500],
                gradings=gradings,
                env_errors=errors,
                rate=errors / gradings if gradings else 0.0,
                threshold=self.settings.quarantine_error_rate,
                at=_now(),
            )
            return "quarantined"

        before, after, _, name = self._update(sha, change)
        if after == "quarantined" and before != "quarantined":
            log.warning("env_quarantined", env_sha=sha, env=name, reason="dishonest", why=why)
        elif after == "seed":
            log.warning("seed_dishonest", env_sha=sha, env=name, why=why)
        return after

    def set_serving_difficulty(self, sha: str, level: int, curve: dict[int, float]) -> None:
        """Serve the environment at `level` from now on; keep the curve and its history."""

        def change(stats: EnvStats, status: str, origin: str) -> str:
            measured = {str(k): float(v) for k, v in sorted(curve.items())}
            stats.serving_difficulty = int(level)
            stats.serving_curve = measured
            search = DifficultySearch(at=_now(), level=int(level), curve=measured)
            stats.pass_rate_history = [*stats.pass_rate_history, search][-HISTORY_LIMIT:]
            return status

        _, _, _, name = self._update(sha, change)
        log.info("serving_difficulty_set", env_sha=sha, env=name, level=level, curve=curve)

    def retire(self, sha: str, reason: str = "manual") -> None:
        """Take an admitted environment out of sampling (`evoenv pool retire`)."""

        def change(stats: EnvStats, status: str, origin: str) -> str:
            if origin == SEED_ORIGIN or status == "seed":
                raise UsageError("seeds are never retired from the pool")
            stats.retired = Retirement(reason=reason, at=_now())
            return "retired"

        _, _, _, name = self._update(sha, change)
        log.info("env_retired", env_sha=sha, env=name, reason=reason)

    def _update(
        self, sha: str, change: Callable[[EnvStats, str, str], str]
    ) -> tuple[str, str, EnvStats, str]:
        """Read-modify-write one row's stats and status in one transaction.

        `change(stats, status, origin)` edits the copy of the stats in place and returns the
        new status. Returns (old status, new status, new stats, name).
        """
        with self.archive.session() as session:
            row = session.get(EnvironmentRow, sha, with_for_update=True)
            if row is None:
                raise KeyError(f"no environment {sha} in the archive")
            stats = row.stats.model_copy(deep=True)
            before = row.status
            after = change(stats, before, row.origin)
            row.stats = stats
            row.status = after
            row.updated_at = utcnow()
            session.add(row)
            session.commit()
            session.refresh(row)
            entry = _entry(row)
            name = row.name
        if after in ACTIVE_STATUSES:
            self._members[sha] = entry
        else:
            self._members.pop(sha, None)
        if after == "quarantined":
            self._quarantined.add(sha)
        self._reindex()
        return before, after, stats, name

    def _reindex(self) -> None:
        seeds = [e for e in self._members.values() if e.is_seed]
        others = [e for e in self._members.values() if not e.is_seed]
        self._seeds = seeds
        self._everyone = seeds + others


def seed_pool(archive: Archive, seeds_dir: Path, *, max_source_bytes: int = 64 * 1024) -> list[str]:
    """Record every `*.py` file of `seeds_dir` as a seed (origin and status `seed`).

    Idempotent by content hash: a seed already recorded is left as it is (its stats kept). A
    row recorded as a seed whose source is no longer among the files (the seed was edited)
    is retired as superseded. Returns the seeds' shas, in file-name order. Raises UsageError
    when the folder holds no seed or a seed fails L1 (names are read statically: no seed
    code runs here).
    """
    files = sorted(Path(seeds_dir).glob("*.py"))
    if not files:
        raise UsageError(f"no seed environments (*.py) in {seeds_dir}")
    named: list[tuple[str, str]] = []
    for path in files:
        data = path.read_bytes()
        static = check_static(data, max_source_bytes)
        if not static.ok or static.name is None:
            raise UsageError(f"seed {path} fails L1: {static.detail}")
        named.append((static.name, data.decode("utf-8-sig")))  # the text L1 judged
    names = [name for name, _ in named]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise UsageError(f"seed names must be unique; repeated: {', '.join(clashes)}")

    shas = [
        archive.add_environment(name, source, status="seed", origin=SEED_ORIGIN)
        for name, source in named
    ]
    current = set(shas)
    with archive.session() as session:
        for sha in shas:  # a seed's source recorded earlier under another status or origin
            row = session.get(EnvironmentRow, sha, with_for_update=True)
            if row is not None and (row.status, row.origin) != ("seed", SEED_ORIGIN):
                row.status, row.origin, row.updated_at = "seed", SEED_ORIGIN, utcnow()
                session.add(row)
        stale = session.exec(
            select(EnvironmentRow).where(
                EnvironmentRow.origin == SEED_ORIGIN, EnvironmentRow.status == "seed"
            )
        ).all()
        for row in stale:
            if row.sha in current:
                continue
            stats = row.stats.model_copy(deep=True)
            stats.retired = Retirement(reason="superseded seed", at=_now())
            row.stats, row.status, row.updated_at = stats, "retired", utcnow()
            session.add(row)
            log.info("seed_superseded", env_sha=row.sha, env=row.name)
        session.commit()
    log.info("seeds_recorded", seeds=len(shas), folder=str(seeds_dir))
    return shas


def _entry(row: EnvironmentRow) -> PoolEntry:
    stats = row.stats
    searched = stats.serving_difficulty is not None
    return PoolEntry(
        sha=row.sha,
        name=row.name,
        source=row.source,
        origin=row.origin,
        difficulty=stats.serving_difficulty if searched else stats.calibration_difficulty,
        searched=searched,
        solve_rate=_solve_rate(stats),
    )


def _solve_rate(stats: EnvStats) -> float | None:
    scored = sum(level.scored for level in stats.served.values())
    passes = sum(level.passes for level in stats.served.values())
    return passes / scored if scored >= SOLVE_RATE_MIN_SCORED else None


def draw(
    entries: list[PoolEntry], rng: random.Random, weight: Callable[[PoolEntry], float] | None
) -> PoolEntry:
    """One of `entries`, in proportion to `weight` (uniformly without one)."""
    if weight is None:
        return rng.choice(entries)
    return rng.choices(entries, weights=[weight(entry) for entry in entries])[0]


def _now() -> str:
    return utcnow().isoformat()
