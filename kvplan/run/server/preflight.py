"""Pre-flight of a target run: before any traffic, is this an OpenAI-compatible server that
serves the model, with this key, and what does its /metrics expose?

::

    GET {url}/models   unreachable -> error; 401/403 -> the key; not a model list -> not OpenAI;
                       target.model not listed -> the ids it lists; else model = the first id
    GET {metrics_url}  Prometheus text with known names -> metrics available, KV pool read
                       (vLLM's or SGLang's cache_config_info, else SGLang's max_total_num_tokens);
                       else unavailable
    GET {root}/props   llama.cpp (owned_by llamacpp, or llamacpp: metrics): its slots and each
                       one's context (total_slots, default_generation_settings.n_ctx), else
                       GET {root}/slots (one entry per slot, each with n_ctx)

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
from kvplan.run.server.server_metrics import MetricsRead, parse_metrics
from kvplan.workload.server import TargetSettings

TIMEOUT_S = 10.0
# servers known to honour vLLM's ignore_eos + min_tokens (exact output lengths); llama.cpp takes
# ignore_eos (tools/server/server-task.cpp params_from_json_cmpl), which with max_tokens fixes the length
EXACT_LENGTH_KINDS = ("vllm", "sglang", "kvplan-engine", "llamacpp")
# servers that take a prompt of token ids on /v1/completions as given: prompt_format auto sends them,
# so a prompt's length and its shared blocks are exactly the sampled ones (text would be re-tokenized)
TOKEN_ID_KINDS = ("vllm", "sglang", "kvplan-engine")
LLAMACPP_KIND = "llamacpp"  # the owned_by of llama-server's /v1/models


@dataclass(frozen=True)
class LlamaSlots:
    """llama-server's pool: ``num_slots`` (``--parallel``) of ``slot_ctx_tokens`` each, from
    ``source`` (``/props`` or ``/slots``). ``pool_tokens`` = their product: the cells of its KV
    buffer with per-slot contexts (the default when --parallel is given); with a unified KV
    (--kv-unified, or --parallel left at auto) every slot sees the one shared context, which is
    then ``slot_ctx_tokens`` (kvplan.sizing.llamacpp). /props does not say which."""

    num_slots: int
    slot_ctx_tokens: int
    source: str

    @property
    def pool_tokens(self) -> int:
        return self.num_slots * self.slot_ctx_tokens


@dataclass(frozen=True)
class Preflight:
    """What the server said: the model to ask for, whose server it is (``owned_by``), its
    max_model_len where /v1/models gives one, and its first /metrics read (None: no metrics)."""

    model: str
    kind: str | None
    max_model_len: int | None
    metrics: MetricsRead | None
    api_key: str | None
    llama: LlamaSlots | None = None  # llama.cpp's slots (read_llama_slots); None for other servers


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
    kind, metrics = card.get("owned_by"), read_metrics(target.scrape_url, key)
    llama_names = metrics is not None and any(n.startswith("llamacpp:") for n in metrics.seen)
    return Preflight(
        model,
        kind,
        max_len if isinstance(max_len, int) and max_len > 0 else None,
        metrics,
        key,
        read_llama_slots(target.server_root, key) if kind == LLAMACPP_KIND or llama_names else None,
    )


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_llama_slots(root: str, key: str | None) -> LlamaSlots | None:
    """llama-server's slots from ``{root}/props`` (``total_slots``, and each slot's context
    ``default_generation_settings.n_ctx``; ggml-org/llama.cpp tools/server/server-context.cpp
    get_props), else ``{root}/slots`` (a list with each slot's ``n_ctx``; off with --no-slots);
    None when neither answers so."""
    try:
        status, body = get(f"{root}/props", key, 5.0)
        props = json.loads(body) if status == 200 else {}
        settings = props.get("default_generation_settings") or {} if isinstance(props, dict) else {}
        slots, ctx = _positive(props.get("total_slots")), _positive(settings.get("n_ctx"))
        if slots and ctx:
            return LlamaSlots(slots, ctx, "/props")
        status, body = get(f"{root}/slots", key, 5.0)
        listed = json.loads(body) if status == 200 else []
        ctxs = [_positive(s.get("n_ctx")) for s in listed if isinstance(s, dict)] if isinstance(listed, list) else []
        if ctxs and all(ctxs):
            return LlamaSlots(len(ctxs), max(c for c in ctxs if c), "/slots")
    except (OSError, ValueError, AttributeError):
        pass
    return None


def read_metrics(url: str, key: str | None, timeout_s: float = 5.0) -> MetricsRead | None:
    """One read of ``url`` (None: no answer, not Prometheus text, or none of the known names)."""
    try:
        status, body = get(url, key, timeout_s)
        read = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None
    except (OSError, ValueError):
        return None
    return read if read is not None and read.seen else None
