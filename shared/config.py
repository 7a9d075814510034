"""Settings, read from the environment once in an entry point and passed down.

Every field is an `EVOENV_*` variable with a default that works on one machine with nothing
configured. Connection settings are flat (`EVOENV_REDIS_URL`, `EVOENV_MODEL`, ...); groups are
nested with a double underscore, e.g. `EVOENV_SANDBOX__OP_SECONDS=5` (docs/settings.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.messages import ProposalMode


class SandboxSettings(BaseModel):
    """Limits and isolation of the sandbox that runs environment code."""

    op_seconds: float = Field(10.0, gt=0)
    """Wall-clock limit for one operation (one routine call, or sample+solve+render of one instance)."""
    memory_mb: int = Field(1024, ge=64)
    """Address-space limit of the process that runs environment code, in MiB."""
    output_bytes: int = Field(1 << 20, ge=1024)
    """Largest result one operation may return, in bytes."""
    start_seconds: float = Field(20.0, gt=0)
    """How long the sandbox may take to start before it counts as unavailable."""
    allow_unconfined: bool = False
    """Opt in to run without bubblewrap, Landlock and seccomp where they are missing. Code is then
    NOT isolated; every report and log line from that mode says so. Never for untrusted code."""
    uid: int = 65534
    """Unprivileged uid (and gid) the sandboxed code runs as when the worker runs as root."""


class ValidationSettings(BaseModel):
    """Thresholds of the mechanical admission stages L1-L5 (docs/CONTRACT.md#admission-stages)."""

    max_source_bytes: int = Field(64 * 1024, ge=1)
    """L1: largest environment file, in bytes; the CLI reads at most this plus one byte of one."""
    seeds: int = 8
    """L2-L5: seeds tested at each of the min, middle and max difficulty."""
    secret: SecretStr = SecretStr("")
    """What L2-L5's seeds derive from, with each file's hash (empty: DATA_DIR/validation.key)."""
    max_prompt_bytes: int = 16 * 1024
    """L2: longest rendered prompt, in bytes (UTF-8)."""
    min_distinct_references: int = 2
    """L4: distinct references required at each tested difficulty."""
    min_distinct_prompts: int = 3
    """L4: distinct prompts required at each tested difficulty."""
    min_length_ratio: float = 1.1
    """L4: mean JSON length of instances at max difficulty over that at min difficulty."""
    leak_min_chars: int = 8
    """L4: answer texts at least this long must not appear verbatim in the prompt..."""
    leak_max_fraction: float = 0.5
    """...in more than this fraction of the sampled instances."""
    well_posed_seeds: int = Field(32, ge=0)
    """L4: instances sampled at the min difficulty, beside L2's, to find prompts shared by
    instances whose answers differ (the prompt must determine the answer)."""
    well_posed_pairs: int = Field(32, ge=0)
    """L4: most pairs of same-prompt instances whose answers are checked across (0: none)."""
    spray_instances: int = 20
    """L5: other instances whose answer texts go into the spray probe."""
    spray_range: tuple[int, int] = (-50, 500)
    """L5: every integer in this closed range also goes into the spray probe."""
    feasibility_reject_fraction: float = 0.5
    """L5: share of cases where a feasibility scorer must reject borrowed/perturbed answers."""
    answer_cap: int = 4096
    """Longest extracted answer, in characters; longer is a format error."""


class ServeSettings(BaseModel):
    """The vLLM OpenAI-compatible server that `evoenv serve` starts (EVOENV_SERVE__...)."""

    host: str = "127.0.0.1"
    """Address to bind; any but loopback needs `api_key` (the weight-reload endpoints are on)."""
    api_key: SecretStr = SecretStr("")
    """Bearer token the server requires on every route but /health and its clients send (empty:
    none, loopback only; set: required on loopback too)."""
    port: int = Field(8000, ge=1, le=65535)
    """TCP port of the server."""
    kv_cache_gib: int = Field(2, ge=1)
    """KV cache size in whole GiB on the CPU (VLLM_CPU_KVCACHE_SPACE); ignored on a GPU."""
    max_model_len: int = Field(16384, ge=256)
    """Longest prompt plus completion, in tokens; capped at what the model supports."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    """Weight and activation dtype of the server, and of the weights the learner pushes to it;
    unset: bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, float32 on other CPUs."""
    extra_args: Annotated[list[str], NoDecode] = []
    """More vLLM arguments, space-separated, e.g. `--max-num-seqs 64`."""
    start_timeout: float = Field(300.0, gt=0)
    """Seconds to wait for the server to answer /health before giving up."""
    weight_push: Literal["reload", "nccl"] = "reload"
    """How the learner makes new weights live: reload from a safetensors folder, or NCCL (GPU)."""
    push_pause: Literal["keep", "wait"] = "keep"
    """How a push pauses the servers: `keep` freezes the requests in flight where they are, swaps
    the weights and lets them go on under the new ones (their KV cache recomputed; the version
    spans say which tokens each version sampled, and a completion counts as its oldest); `wait`
    lets them finish under the old weights first (on a CPU, minutes for a long generator file)."""

    @field_validator("extra_args", mode="before")
    @classmethod
    def _split_args(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.split()
        return value


class WorkerSettings(BaseModel):
    """Celery workers: concurrency, time limits and delivery (docs/DESIGN.md#failure-rules)."""

    concurrency: int = Field(2, ge=1)
    """Worker processes (or threads, for the generation queue) per worker."""
    generation_threads: int = Field(16, ge=1)
    """Threads of a worker serving only the generation queue (I/O bound: many requests in flight)."""
    validate_time_limit: float = Field(300.0, gt=0)
    """Hard time limit of a validate job, in seconds (the soft limit is 90 % of it)."""
    grade_time_limit: float = Field(120.0, gt=0)
    """Hard time limit of a sample or grade job, in seconds."""
    complete_time_limit: float = Field(600.0, gt=0)
    """Seconds of generation a job of the generation queue (completions, proposals, reviews)
    may wait for each answer of the model servers. Seconds the servers spend paused (a weight
    push, a training step taken in turns) do not count, up to `complete_wall_limit`."""
    server_outage_wait: float = Field(180.0, ge=0)
    """Seconds a request of the generation queue that found no model server listening (one
    restarting) waits for one to answer /health, then is sent again at once (0: no wait; the
    job is retried with backoff instead). Within the job's wall limit: at most what
    `complete_wall_limit` leaves above `complete_time_limit`."""
    visibility_timeout: float = Field(900.0, gt=0)
    """Seconds before Redis hands an unacknowledged job to another worker; must exceed every hard
    time limit (a worker killed outright has its jobs redelivered after this)."""
    unresponsive_after: float = Field(90.0, ge=0)
    """Seconds a worker of `evoenv up` may answer no ping (Celery's remote control) while
    another worker answers before `up` kills it and starts it again, its jobs in hand given
    back (a stopped, hung or deadlocked worker; 0: never)."""
    max_tasks_per_child: int = Field(100, ge=0)
    """Jobs a pool process of a validation or grading worker runs before it is replaced by a
    fresh fork (0: never): what the interpreter's heap keeps after each job does not add up
    over a long run."""
    max_retries: int = Field(5, ge=0)
    """Retries of a job that failed for an infrastructure reason (bounded exponential backoff)."""
    max_deliveries: int = Field(8, ge=1)
    """Deliveries (first run, redeliveries, retries) after which a job goes to the dead letters."""
    connect_timeout: float = Field(5.0, gt=0)
    """Seconds to wait for Redis before saying it is unreachable."""
    broker_gone_grace: float = Field(3.0, ge=0)
    """Seconds a stopping worker waits for an unreachable broker before it ends, pool included."""
    stop_with_parent: bool = True
    """Stop (warm shutdown) when the process that started the worker ends (off: `nohup` use)."""

    @property
    def complete_wall_limit(self) -> float:
        """Wall seconds a job of the generation queue may take, paused seconds included: the
        hard time limit of those jobs. `complete_time_limit` plus 90 % of what the visibility
        timeout leaves above it (870 s by default), so that the job ends before Redis would
        hand it to another worker."""
        return self.complete_time_limit + 0.9 * (self.visibility_timeout - self.complete_time_limit)

    @model_validator(mode="after")
    def _visibility_exceeds_limits(self) -> WorkerSettings:
        longest = max(self.validate_time_limit, self.grade_time_limit, self.complete_time_limit)
        if self.visibility_timeout <= longest:
            raise ValueError(
                f"visibility_timeout ({self.visibility_timeout:g} s) must exceed the longest hard "
                f"time limit ({longest:g} s), or running jobs would be handed out twice"
            )
        return self


class FlowerSettings(BaseModel):
    """Flower, the web monitor of the Celery queues."""

    address: str = "127.0.0.1"
    """Interface Flower listens on; keep it on loopback unless basic auth is set."""
    port: int = 5555
    basic_auth: str = ""
    """`user:password` required by Flower's pages and API (empty: none)."""


class PoolWebSettings(BaseModel):
    """`evoenv pool serve`, the read-only web page over the archive (EVOENV_POOL_WEB__...)."""

    host: str = "127.0.0.1"
    """Interface to listen on; any but loopback needs `user` and a password."""
    port: int = Field(8100, ge=0, le=65535)
    """TCP port (0: any free one; the command prints the address)."""
    user: str = ""
    """Basic-auth user name required by every page (empty: no auth, loopback only)."""
    password: SecretStr = SecretStr("")
    """Basic-auth password (`--password-file` wins over it)."""
    sample_chars: int = Field(4000, ge=100)
    """Longest prompt, reference or answer text of a sample instance shown, in characters."""
    sample_cache: int = Field(256, ge=1)
    """Sample instances kept (least recently used goes first), keyed by sha, seed, difficulty."""
    sample_workers: int = Field(4, ge=1)
    """Sandboxes computing sample instances at once, one environment in at most one of them."""


class AdmissionSettings(BaseModel):
    """The model stages of admission and the generator's reward (docs/CONTRACT.md#admission-stages,
    docs/DESIGN.md#the-generators-reward)."""

    reviews: int = Field(3, ge=1)
    """K: semantic self-reviews per candidate; any reject blocks admission."""
    review_temperature: float = 0.6
    """Sampling temperature of the reviewer."""
    review_max_tokens: int = 768
    """Longest review, in tokens."""
    second_solves: int = Field(0, ge=0)
    """Second solves in the review stage: the reviewer writes `solve` again from the rendered
    prompt alone, K times; the review also fails unless one of them agrees with the candidate's
    `solve` (its scorer accepting the answers) on 9 fresh instances at 3 difficulties, which a
    prompt that asks something else than `solve` computes cannot do (0: off)."""
    second_solves_for: Literal["generated", "all"] = "generated"
    """Which candidates the second solves judge: the generator's only, or every file (a
    person's own files too, `evoenv pool add`)."""
    reviewer_url: str = ""
    """OpenAI-compatible endpoint of a different reviewer model (empty: the policy's servers)."""
    reviewer_model: str = ""
    """Model name at `reviewer_url` (empty: the served policy)."""
    reviewer_api_key: SecretStr = SecretStr("")
    """Bearer token sent to `reviewer_url` (empty: none)."""
    sampling_seed: int | None = None
    """Seed of the model stages: the calibration instances and every review and calibration
    request's sampling seed derive from it and the candidate's content, so that admitting the
    same file twice on the same server decides the same way (tests); None: fresh randomness."""
    calibration_instances: int = Field(8, ge=1)
    """m: fresh instances the solver answers once each at the calibration difficulty."""
    calibration_difficulty: int | None = None
    """Difficulty of calibration (None: the middle of the environment's range)."""
    calibration_search: int = Field(0, ge=0)
    """Levels the calibration search may try when the pass rate at the calibration difficulty is
    0 or 1: one level at a time toward the frontier (harder after 1, easier after 0), m fresh
    instances each; a level found inside (0, 1) is calibrated again on m fresh instances, which
    alone decide (0: off, the paper's single calibration)."""
    target_pass_rate: float = 0.3
    """a*: the pass rate admission and serving aim at."""
    quality_width: float = 0.2
    """Width of Q = exp(-(a - a*)^2 / (2 width^2))."""
    novelty_gate: float = 0.80
    """A candidate at this similarity or more to a pool member or earlier group member is rejected."""
    novelty_prompt_weight: float = 0.5
    """Weight of the prompt embeddings' cosine in the similarity (the code's gets the rest)."""
    same_oracle_members: int = Field(3, ge=0)
    """Novelty also rejects a candidate whose reference equals one of its this many nearest
    pool members' on each of its instances: that member's solve under another prompt (0: off)."""
    same_oracle_instances: int = Field(8, ge=1)
    """Instances of the candidate (seeds 0.., the traced difficulty) the members' solve gets."""
    same_oracle_seconds: float = Field(2.0, gt=0)
    """Time limit of a member's solve on one of the candidate's instances."""
    bonus_scale: float = 0.1
    """B = scale x gamma x clip((band_high - s) / (band_high - band_low), 0, 1)."""
    bonus_band: tuple[float, float] = (0.45, 0.65)
    """Similarity band over which the novelty bonus fades from full to zero."""
    gamma_range: tuple[float, float] = (2.0, 5.0)
    """gamma moves between these with the repetitiveness of recent generation groups."""
    repetition_range: tuple[float, float] = (0.3, 0.7)
    """Mean in-group similarity mapped to the low and high end of gamma_range."""
    repetition_window: int = Field(8, ge=1)
    """Generation groups over which repetitiveness is averaged."""
    reward_fail_l1: float = -1.0
    """Generator reward of a candidate failing L1 (static): the lowest of the table."""
    reward_fail_l2: float = -0.9
    """Generator reward of a candidate failing L2 (executes): it got further than L1."""
    reward_fail_l3: float = -0.8
    """Generator reward of a candidate failing L3 (deterministic)."""
    reward_fail_l4: float = -0.7
    """Generator reward of a candidate failing L4 (non-trivial, well-posed)."""
    reward_fail_scorer: float = -0.5
    """Generator reward of a candidate failing L5, and of one too similar (a copy): no Q, no B."""
    reward_pass: float = 1.0
    """Base generator reward of a new candidate passing L1-L5 (plus Q, and B if calibrated)."""
    serving_rounds: int = Field(4, ge=0)
    """Rounds of the serving-difficulty search after admission (0: serve at calibration level)."""


class PoolSettings(BaseModel):
    """The pool of admitted environments: sampling, rotation and quarantine."""

    seed_share: float = Field(0.2, ge=0, le=1)
    """Least share of solver sampling that goes to the ten seeds."""
    retire_after_epochs: int = Field(50, ge=1)
    """An admitted environment retires after this many epochs of use."""
    epoch_instances: int = Field(64, ge=1)
    """Instances served that count as one epoch of use of an environment."""
    quarantine_error_rate: float = Field(0.2, gt=0, le=1)
    """env_error rate beyond which an admitted environment is quarantined..."""
    quarantine_min_gradings: int = Field(16, ge=1)
    """...once it has at least this many gradings."""
    probe_rate: float = Field(1.0, ge=0, le=1)
    """Share of solver grading calls given hidden probes: the reference, an empty and (equality
    oracles) a perturbed answer, at random positions among the answers. Below 1, a call
    without probes can be told from one with them by counting the scorer's calls."""
    rescore_rate: float = Field(0.05, ge=0, le=1)
    """Share of solver groups one of whose scored answers is scored again alone, in a fresh
    sandbox process; a reward that differs quarantines the environment, as a failed probe does."""


class GrpoSettings(BaseModel):
    """The role-conditioned GRPO objective and the optimiser."""

    group_size: int = Field(8, ge=2)
    """G: completions per prompt (solver) or candidates per proposal (generator)."""
    generator_advantage_scale: float = 0.3
    """The generator's advantages are multiplied by this."""
    clip_low: float = 0.2
    """Importance ratios are clipped to [1 - clip_low, 1 + clip_high]."""
    clip_high: float = 0.28
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference model (0: no reference model is kept)."""
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batch_groups: int = Field(4, ge=1)
    """Groups per optimiser step (gradient accumulation over them)."""
    micro_batch: int = Field(4, ge=1)
    """Sequences per forward/backward pass."""
    pad_to_multiple: int = Field(64, ge=1)
    """Each micro-batch is right-padded to a multiple of this many tokens (1: no padding), so
    that its shapes come from a few dozen lengths: the CPU's matrix libraries keep kernels and
    buffers for every shape they have seen, and unpadded lengths grew the learner by 13 MiB a
    solver step without end (docs/results.md#learner-memory). The padding is after every real
    token, so causal attention keeps it out of every log-prob."""
    attention: Literal["sdpa", "flex_attention", "flash_attention_2", "eager"] | None = None
    """The trainer's attention kernels (transformers' `attn_implementation`; None: its
    default, PyTorch's scaled-dot-product attention). Packed rows under `sdpa` get a dense
    block-diagonal mask (memory-efficient kernel, T x T booleans); `flex_attention` builds a
    block mask instead, `flash_attention_2` (its package installed) runs variable lengths."""
    pack: bool = False
    """Pack each micro-batch's sequences into one row, each with its own positions (attention
    stays inside each sequence), instead of one row each padded to the longest: no compute on
    padding where lengths differ (a GPU's micro-batches of several thinking-length
    sequences). Off: on a CPU the micro-batch holds one sequence and nothing is padded."""
    compute_dtype: Literal["bfloat16", "float32"] | None = None
    """Dtype of the trainer's forward and backward passes (autocast; the master weights and
    AdamW stay float32); unset: bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, float32 on
    other CPUs. On an AVX512-BF16 EPYC a step took 0.67x the float32 time (bench_dtype.py)."""
    gradient_checkpointing: bool | None = None
    """Recompute each layer's activations during the backward pass: activation memory of about
    one layer instead of all of them, for about a third more compute. Unset: on in full
    fine-tuning (long generator completions need it on a 24 GB CPU machine), off with LoRA,
    whose trainer has the memory to spare (bench_lora.py, rank 8, the 0.5B model at
    `evoenv up`'s CPU sizes: a step of 14.4 s and 5.4 GiB without, 16.6 s and 3.8 GiB with)."""
    temperature: float = 1.0
    """The solver's training temperature (sampling and log-prob computation)."""
    generator_temperature: float = 0.7
    """The generator's (proposals are sampled and trained at it). Lower than the solver's: a
    whole program must hold together, and with the embedded model 0 of 8 proposals passed
    L1-L5 at 1.0 against 4 of 8 at 0.7 (`bench/bench_proposals.py`)."""
    max_tokens: int = 512
    """Longest solver completion, in tokens."""
    generator_max_tokens: int = 1536
    """Longest generator completion (an environment file), in tokens."""
    lora_rank: int = Field(0, ge=0)
    """Rank of the LoRA adapter the trainer trains instead of every weight (0: full fine-tuning).
    The base weights stay frozen; checkpoints hold the adapter and its optimiser state only, and
    the KL reference is the base itself (the adapter switched off), so no second copy is kept."""
    lora_alpha: int = Field(32, ge=1)
    """LoRA scaling numerator: the adapter's update is multiplied by lora_alpha / lora_rank."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training. 0 keeps the training passes deterministic,
    as the importance ratios assume (the trainer switches the model's own dropout off)."""
    lora_target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        min_length=1,
    )
    """Module names the adapter is attached to (peft's `target_modules`, a JSON list); the
    default: the attention and MLP projections of Qwen2 and Llama."""


class LearnerSettings(BaseModel):
    """The learner process: orchestration, staleness, checkpoints, pushes and evaluation."""

    steps: int = Field(0, ge=0)
    """Optimiser steps to run before stopping (0: until stopped)."""
    ranks: int = Field(1, ge=1)
    """Processes the learner trains on under `evoenv up` (torchrun's --nproc_per_node, one per
    GPU): more than 1 shards the weights, gradients and AdamW's state across them (FSDP2)."""
    max_staleness: int = Field(4, ge=0)
    """Most versions between the policy that sampled a completion and the step that trains on
    it; a group staler than that, when read or at the step, is dropped (counted, logged)."""
    solver_groups_in_flight: int = Field(4, ge=0)
    """Solver groups kept in flight through the queues."""
    generator_groups_in_flight: int = Field(1, ge=0)
    """Generation groups (proposals + admission) kept in flight."""
    take_turns: bool | None = None
    """Pause the model servers while the trainer steps (keep mode: requests in flight wait and
    then go on, nothing is lost), so that the step has every core; resumed after it. None: on
    where the learner has no GPU (generation and training share the CPU's cores)."""
    generation_deadline: float = Field(3600.0, gt=0)
    """Seconds a generation group may take (proposal, L1-L5, model stages); past it, it expires."""
    stream_backlog: int = Field(16, ge=1)
    """Submit no new jobs while this many graded groups wait unread in the stream."""
    synchronous: bool = False
    """The synchronous baseline (bench/bench_async.py): send `grpo.batch_groups` solver groups
    at the current policy version, then nothing until they are trained and the new weights
    pushed; a group not trained (no reward variance, over budget, failed) is replaced in its
    round. No generation groups are sent; `solver_groups_in_flight` does not apply."""
    checkpoint_every: int = Field(5, ge=1)
    """Write a checkpoint every N optimiser steps (and on shutdown)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Checkpoints kept on disk (each the float32 weights and AdamW's two moments: ~12 bytes a
    parameter); a new one is complete before the oldest is removed."""
    push_every: int = Field(1, ge=1)
    """Push the new weights to the vLLM servers every k steps."""
    samples_steps: int = Field(50, ge=0)
    """Steps whose samples of what was trained on the archive keeps (the last N; 0: none kept):
    the run view of `evoenv pool serve`, and TensorBoard's text tab."""
    samples_per_step: int = Field(8, ge=1)
    """Completions sampled from each step's groups, taken from the groups in turn."""
    trace_memory_every: int = Field(0, ge=0)
    """Every k steps, log where the learner's Python allocations grew since the last time
    (`memory_growth`, tracemalloc: slows allocation; 0: off). A diagnosis, not for runs."""
    eval_every: int = Field(10, ge=1)
    """Evaluate the served policy on held-out instances every k steps."""
    eval_at_start: bool = False
    """Evaluate the starting policy before the first step (recorded at step 0), so a run's
    report shows its held-out pass rate at the start beside the last evaluation's; on a CPU it
    delays the first step by the evaluation's completions."""
    eval_instances: int = Field(16, ge=1)
    """Held-out instances per evaluation (evaluation seed range)."""
    eval_difficulty: int | None = None
    """Difficulty of held-out evaluation (None: each environment's serving difficulty)."""
    difficulty: int | None = None
    """Serve solver instances at this difficulty (None: each environment's serving difficulty)."""
    environments: list[str] = []
    """Restrict solver sampling to these environment names (empty: the whole pool)."""
    solver_draw: Literal["spread", "uniform"] = "spread"
    """How solver groups pick their environment (within the seed floor): `spread` favours the
    environments whose recent groups at their current level had reward spread, the only ones
    GRPO learns from (`LevelTracker.draw_weight`); `uniform` draws every member alike."""
    prompt_budget: int = Field(1536, ge=64)
    """Longest solver prompt served, in tokens; longer instances are served one level easier."""
    proposal_examples: int = Field(2, ge=1)
    """Pool members shown as complete example files in each proposal prompt."""
    proposal_topics: bool = True
    """Name a task drawn from `proposal_prompt.TOPICS` in each proposal prompt (False: any new task)."""
    proposal_modes: dict[ProposalMode, float] = {"topic": 1.0}
    """Draw weights of the proposal modes, a JSON object: topic, mutation, repair, own_task (docs/DESIGN.md#proposal-modes)."""
    run_dir: Path | None = None
    """Checkpoints, TensorBoard logs and reports (None: DATA_DIR/runs/RUN)."""

    @field_validator("proposal_modes")
    @classmethod
    def _some_mode_starts(cls, weights: dict[ProposalMode, float]) -> dict[ProposalMode, float]:
        if any(w < 0 for w in weights.values()):
            raise ValueError(f"proposal mode weights must be 0 or more, got {weights}")
        if not any(w > 0 for mode, w in weights.items() if mode != "repair"):
            raise ValueError(
                "a proposal mode other than repair needs a positive weight (a repair needs a "
                f"finished group to repair), got {weights}"
            )
        return weights


MIN_STREAM_KEY = 32
"""Fewest characters of a stream key (`Settings.stream_key`, or the DATA_DIR/stream.key file)."""


class Settings(BaseSettings):
    """All of EvoEnv's settings. Build once with `Settings()` in an entry point."""

    model_config = SettingsConfigDict(
        env_prefix="EVOENV_", env_nested_delimiter="__", extra="ignore", validate_default=True
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Broker, result backend, rollout stream and policy version (a password: redis://:PW@...)."""
    redis_bind: str = "127.0.0.1"
    """Address of the Redis that `evoenv up` or deploy/redis.sh starts; any but loopback needs
    a password (`up` generates one into DATA_DIR/redis-password, deploy/redis.sh refuses)."""
    redis_password: SecretStr = SecretStr("")
    """Password of the Redis that `evoenv up` or deploy/redis.sh starts (set: required on
    loopback too); clients give it in `redis_url`."""
    database_url: str = ""
    """The archive: empty means SQLite at DATA_DIR/archive.db; or a PostgreSQL URL."""
    vllm_urls: Annotated[list[str], NoDecode] = ["http://127.0.0.1:8000"]
    """vLLM servers, comma-separated; requests are spread across them."""
    model: str = "qwen2.5-coder-0.5b-instruct"
    """The policy: an embedded model name, a local Hugging Face folder or a hub id."""
    data_dir: Path = Path("~/.evoenv")
    """Prepared models, the default archive and run folders."""
    seeds_dir: Path = Path(__file__).resolve().parents[1] / "seeds"
    """The hand-written seed environments (one file each)."""
    log_format: Literal["console", "json"] = "console"
    """structlog renderer: human-readable console lines or one JSON object per line."""
    log_level: str = "INFO"
    run: str = "default"
    """Name of the training run: namespaces its rollout stream and groups in Redis."""
    stream_key: SecretStr = SecretStr("")
    """HMAC key of the rollout stream's entries, alike on every host (empty: DATA_DIR/stream.key)."""

    sandbox: SandboxSettings = SandboxSettings()
    validation: ValidationSettings = ValidationSettings()
    worker: WorkerSettings = WorkerSettings()
    flower: FlowerSettings = FlowerSettings()
    pool_web: PoolWebSettings = PoolWebSettings()
    admission: AdmissionSettings = AdmissionSettings()
    pool: PoolSettings = PoolSettings()
    grpo: GrpoSettings = GrpoSettings()
    learner: LearnerSettings = LearnerSettings()
    serve: ServeSettings = ServeSettings()

    @field_validator("vllm_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [url.strip().rstrip("/") for url in value.split(",") if url.strip()]
        return value

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("stream_key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if 0 < len(value.get_secret_value()) < MIN_STREAM_KEY:
            raise ValueError(f"a stream key has at least {MIN_STREAM_KEY} characters")
        return value

    @property
    def run_dir(self) -> Path:
        """The run folder: checkpoints, TensorBoard logs, reports."""
        return (self.learner.run_dir or self.data_dir / "runs" / self.run).expanduser()

    @property
    def archive_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'archive.db'}"

    def masked(self) -> dict[str, Any]:
        """The resolved settings for a start-up log line, passwords masked."""
        data = self.model_dump(mode="json")
        for key in ("redis_url", "database_url"):
            data[key] = mask_url(data[key])
        if data["flower"]["basic_auth"]:
            data["flower"]["basic_auth"] = data["flower"]["basic_auth"].split(":", 1)[0] + ":***"
        return data


def mask_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
