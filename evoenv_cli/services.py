"""Whether the services a local admission's later stages need answer, asked once before those
stages load anything: Redis (the policy version, `pool add`'s report) and the policy's vLLM
server (review, calibration), each named in one line with the setting that points at it."""

from __future__ import annotations

from collections.abc import Collection

import httpx
import redis

from shared.config import Settings, mask_url

MODEL_STAGES = frozenset({"review", "calibration"})
"""The stages that ask the policy's server (and read its version from Redis)."""
PROBE_SECONDS = 3.0


def missing_service(settings: Settings, stages: Collection[str], add_to_pool: bool) -> str | None:
    """One line naming the first service `stages` (and `pool add`, with `add_to_pool`) need
    that does not answer, and how to give it; None when all answer (or none is needed)."""
    asks_model = bool(MODEL_STAGES & set(stages))
    if not (asks_model or add_to_pool):
        return None
    asked = [stage for stage in ("review", "calibration") if stage in stages]
    needs = (
        "pool add needs" if add_to_pool else f"{' and '.join(asked)} need{'s' * (len(asked) == 1)}"
    )
    redis_problem = _redis_problem(settings.redis_url)
    if redis_problem is not None:
        return (
            f"{needs} Redis at {mask_url(settings.redis_url)}, and {redis_problem}: start "
            "`evoenv up` (or deploy/redis.sh), or set EVOENV_REDIS_URL to a running one"
        )
    if not asks_model:
        return None
    for url, token, setting in _model_servers(settings, stages):
        problem = _server_problem(url, token)
        if problem is not None:
            return (
                f"{needs} the model server at {url}, and {problem}: start `evoenv up` "
                f"(or `evoenv serve`), or set {setting} to a running one"
            )
    return None


def _redis_problem(url: str) -> str | None:
    """Why Redis at `url` cannot be used (it does not answer, or refuses the password), or None."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=PROBE_SECONDS, socket_timeout=PROBE_SECONDS
    )
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return f"it refused the password in the URL ({exc})"
    except (redis.RedisError, OSError) as exc:
        return f"it does not answer ({exc})"
    finally:
        client.close()
    return None


def _model_servers(settings: Settings, stages: Collection[str]) -> list[tuple[str, str, str]]:
    """(url, bearer token, the setting naming it) of each server the stages ask."""
    policy_token = settings.serve.api_key.get_secret_value()
    servers = [(url.rstrip("/"), policy_token, "EVOENV_VLLM_URLS") for url in settings.vllm_urls]
    reviewer = settings.admission.reviewer_url.rstrip("/")
    if "review" in stages and reviewer:
        token = settings.admission.reviewer_api_key.get_secret_value()
        servers.append((reviewer, token, "EVOENV_ADMISSION__REVIEWER_URL"))
    return servers


def _server_problem(url: str, token: str) -> str | None:
    """Why the OpenAI-compatible server at `url` cannot be asked (its model listing, which a
    wrong token is refused), or None."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=PROBE_SECONDS)
    except httpx.HTTPError as exc:
        return f"it does not answer ({type(exc).__name__}: {exc or 'no reply'})"
    if models.status_code == 401:
        return "it refused the token (its setting's API key is not the server's)"
    if models.status_code != 200:
        return f"its /v1/models answered {models.status_code}"
    return None
