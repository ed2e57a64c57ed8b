"""Admission at the entry: which requests the engine takes into its queue, and which it refuses.

Off unless one of EngineConfig's admission settings is given (then the Scheduler owns one
``Admission``); a refused request finishes at once with reason ``rejected`` and a detail that
starts with its reason code, so ``python -m engine.serve`` answers it 429 and a simulation, which
runs this same Scheduler, refuses exactly the same requests. The checks, in order, at
``Scheduler.add_request`` (after the checks that a request could ever fit)::

    max_tokens := min(max_tokens, max_output_tokens)          clamped, never refused
    queue_full      waiting requests       >= max_num_waiting
    tenant_waiting  the tenant's waiting   >= tenant_max_waiting
    kv_budget       reserved + own blocks  >  budget
        own blocks = ceil((prompt + max_tokens - 1) / block_size)   every block it can ever hold
        reserved   = sum of own blocks over the waiting and running requests
        budget     = floor(num_blocks x (1 - kv_admission_reserve))

and one rule when the scheduler takes waiting requests in: a request whose tenant already has
``tenant_max_concurrency`` running waits, and those queued behind it may go first.

What holds, exactly, at every step:

- KV budget on: the blocks the running requests hold sum to at most the budget, and no block
  allocation can fail, so no request is ever preempted (the price: requests that would have fit
  beside shorter-lived ones are refused, since max_tokens is counted in full).
- a tenant's running requests <= tenant_max_concurrency; its waiting ones <= tenant_max_waiting
  unless a preemption sent one back to the queue (none with a KV budget); running + waiting <=
  both limits' sum.

The clamp follows vLLM, whose server takes the least of the request's ``max_tokens`` and its
generation config's ``max_new_tokens`` rather than refusing (vllm/entrypoints/utils.py,
``get_max_tokens``); a prompt + max_tokens over max_model_len stays refused (cannot_fit, HTTP 400).
A request without a tenant is under no per-tenant limit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.config import EngineConfig, SettingError
from engine.request import Request, RequestStatus, SamplingParams

QUEUE_FULL, TENANT_WAITING, KV_BUDGET = "queue_full", "tenant_waiting", "kv_budget"
REASONS = (QUEUE_FULL, TENANT_WAITING, KV_BUDGET)  # the reason codes, in the order they are checked
SETTINGS = (
    "max_num_waiting",
    "kv_admission_reserve",
    "max_output_tokens",
    "tenant_max_concurrency",
    "tenant_max_waiting",
)


def reason_of(detail: str) -> str:
    """The reason code a rejected request's ``finish_detail`` starts with (``kv_budget: ...``)."""
    return detail.split(":", 1)[0]


def budget_blocks(num_blocks: int, reserve: float) -> int:
    """The KV budget: ``floor(num_blocks x (1 - reserve))`` blocks."""
    return int(num_blocks * (1.0 - reserve))


class Admission:
    """The policy of one EngineConfig over a pool of ``num_blocks`` blocks, and the counts it
    keeps: blocks reserved by queued and running requests, and each tenant's running and waiting
    requests. The Scheduler calls it at every change of a request's state."""

    def __init__(self, config: EngineConfig, num_blocks: int):
        """Raises: SettingError: ``kv_admission_reserve`` leaves a budget of no block (no request
        could ever be admitted)."""
        self.max_num_waiting = config.max_num_waiting
        self.max_output_tokens = config.max_output_tokens
        self.tenant_max_concurrency = config.tenant_max_concurrency
        self.tenant_max_waiting = config.tenant_max_waiting
        reserve = config.kv_admission_reserve
        self.budget_blocks = None if reserve is None else budget_blocks(num_blocks, reserve)
        if self.budget_blocks is not None and self.budget_blocks < 1:
            raise SettingError(
                "kv_admission_reserve",
                f"leaves a KV budget of 0 of the pool's {num_blocks} blocks, so no request could run"
                f" (got {reserve}; at most {1 - 1 / num_blocks:.4g} here)",
            )
        self.num_reserved_blocks = 0
        self._blocks: dict[str, int] = {}  # request id -> its reserved blocks (queued or running)
        self._tenants: dict[str, list[int]] = {}  # tenant -> [running, waiting]

    @classmethod
    def of(cls, config: EngineConfig, num_blocks: int) -> Admission | None:
        """The config's admission, None when every admission setting is off."""
        if all(getattr(config, name) is None for name in SETTINGS):
            return None
        return cls(config, num_blocks)

    # ---- at the entry -------------------------------------------------------------------
    def clamp(self, params: SamplingParams) -> SamplingParams:
        """``params`` with max_tokens (and min_tokens) at most max_output_tokens."""
        cap = self.max_output_tokens
        if cap is None or params.max_tokens <= cap:
            return params
        return replace(params, max_tokens=cap, min_tokens=min(params.min_tokens, cap))

    def never_fits(self, num_blocks: int) -> str | None:
        """Why a request of ``num_blocks`` blocks could never be admitted (over the KV budget on
        its own), else None."""
        if self.budget_blocks is not None and num_blocks > self.budget_blocks:
            return f"needs {num_blocks} blocks, the KV admission budget is {self.budget_blocks}"
        return None

    def refusal(self, request: Request, num_blocks: int, num_waiting: int) -> str | None:
        """Why ``request`` (of ``num_blocks`` blocks) is refused now, ``"<reason>: <numbers>"``,
        or None: it may queue (then call ``queued``)."""
        if self.max_num_waiting is not None and num_waiting >= self.max_num_waiting:
            return f"{QUEUE_FULL}: {num_waiting} waiting, max_num_waiting {self.max_num_waiting}"
        tenant = request.tenant
        if tenant is not None and self.tenant_max_waiting is not None:
            waiting = self._tenants.get(tenant, (0, 0))[1]
            if waiting >= self.tenant_max_waiting:
                return f"{TENANT_WAITING}: tenant {tenant!r} has {waiting} waiting, max {self.tenant_max_waiting}"
        budget = self.budget_blocks
        if budget is not None and self.num_reserved_blocks + num_blocks > budget:
            return f"{KV_BUDGET}: needs {num_blocks} blocks, {self.num_reserved_blocks} of {budget} reserved"
        return None

    def queued(self, request: Request, num_blocks: int) -> None:
        self._blocks[request.request_id] = num_blocks
        self.num_reserved_blocks += num_blocks
        if request.tenant is not None:
            self._tenants.setdefault(request.tenant, [0, 0])[1] += 1

    # ---- state changes ------------------------------------------------------------------
    def may_run(self, request: Request) -> bool:
        """Whether ``request``'s tenant is below tenant_max_concurrency running requests."""
        cap, tenant = self.tenant_max_concurrency, request.tenant
        return cap is None or tenant is None or self._tenants[tenant][0] < cap

    def started(self, request: Request) -> None:
        """``request`` went from waiting to running (admitted by the scheduler)."""
        if request.tenant is not None:
            counts = self._tenants[request.tenant]
            counts[0] += 1
            counts[1] -= 1

    def preempted(self, request: Request) -> None:
        """``request`` went from running back to waiting."""
        if request.tenant is not None:
            counts = self._tenants[request.tenant]
            counts[0] -= 1
            counts[1] += 1

    def finished(self, request: Request) -> None:
        """``request`` leaves (called before its status turns FINISHED); a refused one never came in."""
        num_blocks = self._blocks.pop(request.request_id, None)
        if num_blocks is None:
            return
        self.num_reserved_blocks -= num_blocks
        if request.tenant is not None:
            counts = self._tenants[request.tenant]
            counts[0 if request.status is RequestStatus.RUNNING else 1] -= 1
            if counts == [0, 0]:
                del self._tenants[request.tenant]

    def tenant_columns(self) -> dict[str, Any]:
        """StepStats' per-tenant fields: the tenants with a request queued or running, by name,
        and each one's running and waiting requests."""
        names = tuple(sorted(self._tenants))
        return {
            "tenant_ids": names,
            "tenant_num_running": tuple(self._tenants[t][0] for t in names),
            "tenant_num_waiting": tuple(self._tenants[t][1] for t in names),
        }
