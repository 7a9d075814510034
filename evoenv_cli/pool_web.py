"""`evoenv pool serve`: a read-only web page over the archive (the pool, each environment, the
run's admission funnel), rendered on the server by FastAPI and Jinja2. `create_app` builds the
app; `serve` checks the address and credentials, binds, and runs it under uvicorn."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2
import structlog
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import HTTPException, RequestValidationError, StarletteHTTPException
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from pydantic import SecretStr
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from starlette.concurrency import run_in_threadpool

from evoenv_cli import pool_web_data as data
from evoenv_cli.pool_web_guard import Guard, credentials
from evoenv_cli.pool_web_sample import Described, Sample, Sampler, truncate
from shared.config import Settings, mask_url
from shared.db import ENV_STATUSES, Archive, EnvironmentRow
from shared.environment import MAX_SEED
from shared.errors import SandboxFailure, SandboxUnavailable, UsageError
from shared.ports import is_loopback

log = structlog.get_logger(__name__)

FAILED = "this page failed; the server's log says why."
TEMPLATES = "templates/pool"
UNENCODABLE = re.compile("[\ud800-\udfff]")
"""What no UTF-8 text can carry: lone surrogates (code points of a UTF-16 pair)."""


@dataclass(frozen=True)
class Sampled:
    """The sample section of an environment's page: the description and the instance (None:
    not computed for this page), the seed and difficulty its form offers, or why the sandbox
    could not run."""

    described: Described | None
    sample: Sample | None
    seed: int
    level: int | None
    error: str = ""


class PoolSite:
    """The pages, over one archive and one `Sampler`. Templates autoescape everything they
    are given; the one piece of markup passed in whole is Pygments' highlighted source, which
    escapes the code it wraps."""

    def __init__(self, settings: Settings) -> None:
        self.archive = Archive(settings.archive_url)
        self.sampler = Sampler(settings)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("evoenv_cli", TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        limit = settings.pool_web.sample_chars
        self.templates.filters["clip"] = lambda text: truncate(str(text), limit)
        self.formatter = HtmlFormatter(linenos="table", cssclass="highlight")
        css = files("evoenv_cli").joinpath(TEMPLATES, "pool.css").read_text("utf-8")
        self.stylesheet = css + "\n" + self.formatter.get_style_defs(".highlight")

    def page(self, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """The template `name` rendered; any text UTF-8 cannot carry is replaced (U+FFFD)."""
        html = self.templates.get_template(name).render(statuses=ENV_STATUSES, **context)
        return HTMLResponse(UNENCODABLE.sub("\ufffd", html), status_code=status_code)

    def error(self, status_code: int, message: str) -> HTMLResponse:
        title = {400: "bad request", 404: "not found", 500: "server error"}.get(
            status_code, f"error {status_code}"
        )
        return self.page("error.html", status_code, title=title, message=message)

    def pool(self, status: str | None) -> HTMLResponse:
        if status is not None and status not in ENV_STATUSES:
            raise HTTPException(404, f"no status {status!r} (one of {', '.join(ENV_STATUSES)})")
        rows, counts = data.pool_rows(self.archive, status)
        return self.page("pool.html", rows=rows, counts=counts, status=status)

    def find(self, key: str) -> EnvironmentRow:
        try:
            row = self.archive.find(key)
        except UsageError as exc:
            raise HTTPException(404, str(exc)) from exc
        if row is None:
            raise HTTPException(404, f"no environment {key!r} in the archive")
        return row

    async def sampled(
        self, row: EnvironmentRow, seed: int | None, difficulty: int | None
    ) -> Sampled:
        """With a seed, the description and the instance of `row`, computed (or cached); else
        the description if cached, and nothing computed: a page without a seed never waits on
        the sandbox."""
        preferred = row.stats.serving_difficulty or row.stats.calibration_difficulty
        if seed is None:
            described = self.sampler.described(row.sha)
            wanted = difficulty if difficulty is not None else preferred
            level = described.clamp(difficulty, preferred) if described else wanted
            return Sampled(described, None, 0, level)
        try:
            described = await self.sampler.describe(row.sha, row.source)
            level = described.clamp(difficulty, preferred)
            sample = None
            if not described.error and level is not None:
                sample = await self.sampler.sample(row.sha, row.source, seed, level)
        except (SandboxUnavailable, SandboxFailure) as exc:
            return Sampled(None, None, seed, difficulty, f"the sandbox could not run: {exc}")
        return Sampled(described, sample, seed, level)

    def environment(self, row: EnvironmentRow, sampled: Sampled) -> HTMLResponse:
        return self.page(
            "env.html",
            row=row,
            summary=data.pool_row(row),
            source=Markup(highlight(row.source, PythonLexer(), self.formatter)),
            sampled=sampled,
            isolated=self.sampler.isolated,
            reports=data.reports_of(self.archive, row.sha),
            lineage=data.lineage(self.archive, row),
            history=data.history(row),
            spark=(data.SPARK_WIDTH, data.SPARK_HEIGHT),
        )

    def funnel(self, stage: str | None) -> HTMLResponse:
        funnel = data.funnel(self.archive)
        if stage is None:
            shown = [c for c in funnel.candidates if c.stage != "admitted"]
        else:
            shown = [c for c in funnel.candidates if c.stage == stage]
        return self.page("funnel.html", funnel=funnel, shown=shown, stage=stage)

    def runs(self) -> HTMLResponse:
        runs = [
            (run, data.run_steps(self.archive, run)) for run in self.archive.runs_with("samples")
        ]
        return self.page("runs.html", runs=runs)

    def run(self, run: str, step: int | None) -> HTMLResponse:
        steps = data.run_steps(self.archive, run)
        if not steps:
            raise HTTPException(404, f"no samples of a run {run!r} in the archive")
        shown = steps[0].step if step is None else step
        samples = data.samples_of_step(self.archive, run, shown)
        if samples is None:
            raise HTTPException(404, f"no samples of step {shown} of run {run!r} in the archive")
        return self.page("run.html", run=run, steps=steps, step=shown, samples=samples)

    def report(self, job_id: str) -> HTMLResponse:
        stored = data.report_by_job(self.archive, job_id)
        if stored is None:
            raise HTTPException(404, f"no validation report {job_id!r} in the archive")
        row = self.archive.environment(stored.env_sha)
        return self.page("report.html", stored=stored, row=row)


def create_app(settings: Settings) -> FastAPI:
    """The web app over `settings.archive_url` (GET only). With `pool_web.user` set, every
    request needs those basic-auth credentials; every response gets `SECURITY_HEADERS`, and a
    page that fails is a 500 page (see `Guard`). The pages that sample wait on the sampler's
    own pool; the others run on the server's threads and never wait on a sample."""
    site = PoolSite(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            site.sampler.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sampler = site.sampler
    web = settings.pool_web
    expected = credentials(web.user, web.password) if web.user else None
    app.add_middleware(Guard, credentials=expected, failed=lambda: site.error(500, FAILED))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return site.error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_query(_: Request, exc: RequestValidationError) -> HTMLResponse:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:])
        return site.error(400, f"{where}: {first['msg']}")

    @app.get("/static/pool.css")
    def css() -> Response:
        return Response(site.stylesheet, media_type="text/css")

    @app.get("/", response_class=HTMLResponse)
    def pool_page(status: str | None = None) -> HTMLResponse:
        return site.pool(status)

    @app.get("/env/{key}", response_class=HTMLResponse)
    async def environment_page(
        key: str,
        seed: int | None = Query(None, ge=0, le=MAX_SEED),
        difficulty: int | None = Query(None, ge=-MAX_SEED, le=MAX_SEED),
    ) -> HTMLResponse:
        row = await run_in_threadpool(site.find, key)
        sampled = await site.sampled(row, seed, difficulty)
        return await run_in_threadpool(site.environment, row, sampled)

    @app.get("/funnel", response_class=HTMLResponse)
    def funnel_page(stage: str | None = None) -> HTMLResponse:
        return site.funnel(stage)

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page() -> HTMLResponse:
        return site.runs()

    @app.get("/run/{run}", response_class=HTMLResponse)
    def run_page(run: str, step: int | None = Query(None, ge=0, le=MAX_SEED)) -> HTMLResponse:
        return site.run(run, step)

    @app.get("/report/{job_id}", response_class=HTMLResponse)
    def report_page(job_id: str) -> HTMLResponse:
        return site.report(job_id)

    return app


# ------------------------------------------------------------------------------- the command


def serve_command(
    settings: Settings,
    host: str | None,
    port: int | None,
    user: str | None,
    password_file: Path | None,
) -> None:
    """`evoenv pool serve`: the options over the settings, checked; then `serve`."""
    web = settings.pool_web
    update: dict[str, Any] = {
        "host": web.host if host is None else host,
        "port": web.port if port is None else port,
        "user": web.user if user is None else user,
    }
    if password_file is not None:
        update["password"] = SecretStr(_read_password(password_file))
    web = web.model_copy(update=update)
    has_password = bool(web.password.get_secret_value())
    if web.user and not has_password:
        raise UsageError(
            f"user {web.user!r} has no password: give --password-file FILE "
            "or set EVOENV_POOL_WEB__PASSWORD"
        )
    if has_password and not web.user:
        raise UsageError("a password without a user: give --user or set EVOENV_POOL_WEB__USER")
    if not web.user and not is_loopback(web.host):
        raise UsageError(
            f"refusing to serve the archive on {web.host} without basic auth: give --user and "
            "--password-file (or EVOENV_POOL_WEB__USER and __PASSWORD), or keep to 127.0.0.1"
        )
    serve(settings.model_copy(update={"pool_web": web}))


def _read_password(path: Path) -> str:
    try:
        password = path.read_text("utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"cannot read the password file {path}: {why}") from exc
    if not password:
        raise UsageError(f"the password file {path} is empty")
    return password


def serve(settings: Settings) -> None:
    """Bind `pool_web.host:port`, add the seeds to the archive where they are missing (as
    `pool list` does), print the address, serve until interrupted."""
    import uvicorn

    from evoenv_cli.envs import err, out
    from evoenv_cli.pool import archive_line
    from evoenv_learner.pool import seed_pool

    web = settings.pool_web
    sock = listen(web.host, web.port)
    seed_pool(Archive(settings.archive_url), settings.seeds_dir)  # as `pool list` shows them
    app = create_app(settings)
    port = sock.getsockname()[1]
    shown = f"[{web.host}]" if ":" in web.host else web.host
    log.info(
        "pool_web_started",
        host=web.host,
        port=port,
        auth=bool(web.user),
        archive=mask_url(settings.archive_url),
    )
    err.print(archive_line(settings), markup=False)
    out.print(f"pool on http://{shown}:{port}/", markup=False)
    out.file.flush()
    config = uvicorn.Config(
        app, log_config=None, access_log=False, server_header=False, lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[sock])


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port`; a port in use or an address not here is a `UsageError`."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host}: {exc.strerror}") from exc
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock
