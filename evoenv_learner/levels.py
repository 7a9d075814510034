"""Which difficulty each environment's solver groups are served at, how it moves with the
solver, and how strongly the solver draw favours an environment (its groups' reward spread)."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from evoenv_learner.pool import PoolEntry
from shared.config import Settings
from shared.static import check_static

log = structlog.get_logger(__name__)

LEVEL_WINDOW = 4
"""Solver groups observed at a level before it may move."""
LEVEL_BAND = 0.25
"""How far the pass rate may stray from the target before the level moves."""
SPREAD_WINDOW = 8
"""Solver groups per environment and level that the draw remembers (`draw_weight`)."""
SPREAD_FLOOR = 0.1
"""The least draw weight, whatever an environment's groups (1: uniform)."""


@dataclass(frozen=True, slots=True)
class EnvInfo:
    """What the learner reads of an environment's class from its source's syntax tree (it never
    imports environment code)."""

    oracle: str
    low: int
    high: int


@dataclass
class LevelTracker:
    """Per environment: the level its solver groups are served at, and the reward spread of its
    recent groups per level (both kept in checkpoints).

    Levels (beyond the reference design): an environment is served at its serving difficulty
    once its search has ended (`serving_search.py`), then its level moves with the solver
    (`record_outcome`); until then at its calibration difficulty, which does not move. Seeds
    start at their easiest level. A prompt over the prompt budget caps the level (`over_budget`).

    Spread (beyond the reference design, `learner.solver_draw`): GRPO learns nothing from a
    group whose answers all score alike, and at the start most groups are such (the 0.5B solver
    scores 0 on every answer of 7 of the 10 seeds at their easiest level; in a 3-step
    `evoenv up` on two cores 35 groups were skipped for 6 trained). The draw favours the
    environments whose recent groups at their current level had reward spread: weight
    `SPREAD_FLOOR` + (1 - `SPREAD_FLOOR`) x (k + 1) / (n + 2) for k of the last n (at most
    `SPREAD_WINDOW`) groups, 0.55 for one not tried yet. The floor keeps every member drawn now
    and then, so one the solver starts to solve (or fail) is noticed; a level that moves starts
    its own count."""

    settings: Settings
    levels: dict[str, int] = field(default_factory=dict)
    """Per environment: the difficulty solver groups are served at now."""
    spread: dict[str, list[int]] = field(default_factory=dict)
    """Per "SHA/LEVEL": 1 or 0 for each of its last `SPREAD_WINDOW` solver groups, as they had
    reward spread or not (kept in checkpoints)."""
    ceilings: dict[str, int] = field(default_factory=dict)
    """Per environment: the highest difficulty whose prompt fits the prompt budget."""
    _info: dict[str, EnvInfo] = field(default_factory=dict)
    _outcomes: dict[str, list[float]] = field(default_factory=dict)
    _search_given_up: set[str] = field(default_factory=set)
    """Environments whose search measured nothing in this process (searched again on restart)."""

    def info(self, entry: PoolEntry) -> EnvInfo:
        if entry.sha not in self._info:
            static = check_static(entry.source.encode(), self.settings.validation.max_source_bytes)
            self._info[entry.sha] = EnvInfo(static.oracle, *static.difficulties)
        return self._info[entry.sha]

    def difficulty(self, entry: PoolEntry) -> int:
        """The fixed difficulty if configured; else the level tracked for this environment,
        starting at its serving (or calibration) difficulty, or its easiest level.

        An environment awaiting its search stays at its calibration difficulty, untracked, so
        that neither the level adaptation nor a level restored from a checkpoint written before
        the search ended can override the search's result."""
        info = self.info(entry)
        if self.settings.learner.difficulty:
            level = self.settings.learner.difficulty
        elif self.awaits_search(entry):
            level = entry.difficulty or info.low
        else:
            level = self.levels.setdefault(entry.sha, entry.difficulty or info.low)
        level = min(level, self.ceilings.get(entry.sha, info.high))
        return max(info.low, min(info.high, level))

    def awaits_search(self, entry: PoolEntry) -> bool:
        """Whether `entry` is to be searched before it is served at a level that moves.

        Seeds are not searched: they start at their easiest level and climb with the level
        adaptation, as before (searching all ten would cost rounds x m completions each before
        training starts on every fresh archive). Nothing is searched with a fixed
        `learner.difficulty` or with `admission.serving_rounds` at 0."""
        return (
            self.settings.admission.serving_rounds > 0
            and not self.settings.learner.difficulty
            and not entry.is_seed
            and not entry.searched
            and entry.sha not in self._search_given_up
        )

    def searched(self, env_sha: str, level: int) -> None:
        """The search found `level`: serve it from now on, the adaptation's count starting
        afresh."""
        self.levels[env_sha] = level
        self._outcomes.pop(env_sha, None)

    def give_up_search(self, env_sha: str) -> None:
        """The search measured nothing: serve at the calibration difficulty, moving with the
        solver, until the learner restarts."""
        self._search_given_up.add(env_sha)

    def over_budget(self, env_sha: str, difficulty: int) -> None:
        """A prompt at `difficulty` did not fit: serve this environment one level easier."""
        info = self._info.get(env_sha)
        low = info.low if info else 1
        self.ceilings[env_sha] = max(
            low, min(self.ceilings.get(env_sha, difficulty), difficulty - 1)
        )

    def draw_weight(self, entry: PoolEntry) -> float:
        """How strongly the solver draw favours `entry` (class doc): from the share of its
        recent groups at the level it is served at now that had reward spread."""
        seen = self.spread.get(_spread_key(entry.sha, self.difficulty(entry)), [])
        share = (sum(seen) + 1) / (len(seen) + 2)
        return SPREAD_FLOOR + (1.0 - SPREAD_FLOOR) * share

    def record_outcome(
        self, env_sha: str, difficulty: int, passes: int, total: int, *, spread: bool | None = None
    ) -> None:
        """Move an environment's level with the solver (beyond the reference design): after
        `LEVEL_WINDOW` groups at its level, one level harder when the pass rate is above
        `target + LEVEL_BAND`, one easier when below `target - LEVEL_BAND`. `spread`: whether
        the group's rewards differed (for the draw, `draw_weight`)."""
        if spread is not None:
            recent = self.spread.setdefault(_spread_key(env_sha, difficulty), [])
            recent.append(int(spread))
            del recent[:-SPREAD_WINDOW]
        if self.settings.learner.difficulty or total == 0 or self.levels.get(env_sha) != difficulty:
            return
        window = self._outcomes.setdefault(env_sha, [])
        window.append(passes / total)
        if len(window) < LEVEL_WINDOW:
            return
        rate = sum(window) / len(window)
        target = self.settings.admission.target_pass_rate
        info = self._info.get(env_sha)
        low, high = (info.low, info.high) if info else (difficulty, difficulty)
        if rate > target + LEVEL_BAND and difficulty < high:
            self.levels[env_sha] = difficulty + 1
        elif rate < target - LEVEL_BAND and difficulty > low:
            self.levels[env_sha] = difficulty - 1
        if self.levels[env_sha] != difficulty:
            log.info(
                "difficulty_moved",
                env_sha=env_sha,
                old=difficulty,
                new=self.levels[env_sha],
                pass_rate=round(rate, 3),
            )
        window.clear()


def _spread_key(env_sha: str, difficulty: int) -> str:
    return f"{env_sha}/{difficulty}"
