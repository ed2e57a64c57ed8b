"""Pre-flight of a target run: before any traffic, is this an OpenAI-compatible server that
serves the model, with this key, and what does its /metrics expose?

::

    GET {url}/models   unreachable -> error; 401/403 -> the key; not a model list -> not OpenAI;
                       target.model not listed -> the ids it lists; else model = the first id
    GET {metrics_url}  Prometheus text with known names -> metrics available, KV pool read
                       (vLLM's cache_config_info, SGLang's max_total_num_tokens); else unavailable

Each failure is one ``KvplanError`` naming the setting at fault (``target.url``, or ``target``
when the URL came from ``--target``) and exits 2 before a level starts.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.load.target.server_metrics import MetricsRead, parse_metrics
from kvplan.load.target.settings import TargetSettings

TIMEOUT_S = 10.0
# servers known to honour vLLM's ignore_eos + min_tokens (exact output lengths)
EXACT_LENGTH_KINDS = ("vllm", "sglang", "kvplan-engine")


@dataclass(frozen=True)
class Preflight:
    """What the server said: the model to ask for, whose server it is (``owned_by``), its
    max_model_len where /v1/models gives one, and its first /metrics read (None: no metrics)."""

    model: str
    kind: str | None
    max_model_len: int | None
    metrics: MetricsRead | None
    api_key: str | None


def api_key(target: TargetSettings, source: str | None) -> str | None:
    """The key from the environment variable ``target.api_key_env`` names (never from the file).

    Raises:
        KvplanError: the variable is not set.
    """
    if target.api_key_env is None:
        return None
    key = os.environ.get(target.api_key_env)
    if not key:
        raise KvplanError(
            "target.api_key_env",
            f"the environment variable {target.api_key_env} is not set",
            f"export {target.api_key_env}=<the server's API key>",
            source=source,
        )
    return key


def get(url: str, key: str | None, timeout_s: float = TIMEOUT_S) -> tuple[int, bytes]:
    """(status, body) of a GET; raises OSError (URLError) when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def run_preflight(target: TargetSettings, field: str, source: str | None) -> Preflight:
    """Check the server (see the module docstring). ``field``/``source``: how errors name the URL.

    Raises:
        KvplanError: unreachable, refused key, not OpenAI-compatible, model not served.
    """
    key = api_key(target, source)
    models_url = f"{target.url}/models"
    try:
        status, body = get(models_url, key)
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise KvplanError(
            field,
            f"cannot reach {target.url} ({reason})",
            "start the server, or fix the URL (http://HOST:PORT/v1)",
            source=source,
        ) from None
    if status in (401, 403):
        fix = (
            f"check the key in {target.api_key_env}"
            if target.api_key_env
            else "put the key in an environment variable and name it in target.api_key_env"
        )
        raise KvplanError(
            field, f"the server refused the request (HTTP {status} on GET /v1/models)", fix, source=source
        )
    not_openai = "give the OpenAI base URL (vLLM, SGLang and transformers serve answer at http://HOST:PORT/v1)"
    if status != 200:
        raise KvplanError(
            field,
            f"not an OpenAI-compatible server: GET {models_url} answered HTTP {status}",
            not_openai,
            source=source,
        )
    try:
        cards = json.loads(body)["data"]
        ids = [card["id"] for card in cards]
        assert ids and all(isinstance(i, str) for i in ids)
    except Exception:  # noqa: BLE001  any other shape is not a model list
        raise KvplanError(
            field, f"not an OpenAI-compatible server: GET {models_url} gave no model list", not_openai, source=source
        ) from None
    if target.model is not None and target.model not in ids:
        raise KvplanError(
            "target.model",
            f"{target.model!r} is not served at {target.url}; it serves {', '.join(map(repr, ids[:10]))}",
            "use one of those, or leave target.model out",
            source=source,
        )
    model = target.model or ids[0]
    card = cards[ids.index(model)]
    max_len = card.get("max_model_len")
    return Preflight(
        model,
        card.get("owned_by"),
        max_len if isinstance(max_len, int) and max_len > 0 else None,
        read_metrics(target.scrape_url, key),
        key,
    )


def read_metrics(url: str, key: str | None, timeout_s: float = 5.0) -> MetricsRead | None:
    """One read of ``url`` (None: no answer, not Prometheus text, or none of the known names)."""
    try:
        status, body = get(url, key, timeout_s)
        read = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None
    except (OSError, ValueError):
        return None
    return read if read is not None and read.seen else None
