"""The scheduler of a disaggregated worker: the aggregated one plus two moves.

Prefill worker (``hold=True``): a request that finishes by length with exactly one output token
(token 1; the prefill worker runs every request with max_tokens = 1) keeps its blocks under
``held_key(request_id)`` instead of freeing them; it has left the running set, so it no longer
counts against max_num_seqs. ``release`` frees them (after the transfer, or on a cancel).

Decode worker: ``join`` puts a transferred request (its blocks already allocated under its id,
its prompt's K/V written) into the running set with num_computed_tokens = prompt_len and token 1
as its next input. From then on it is an ordinary running request (preemption recomputes it here).
"""

from __future__ import annotations

from engine.request import FinishReason, Request, RequestStatus
from engine.scheduler import Scheduler


def held_key(request_id: str) -> str:
    """The block-table key a prefill worker holds a handed-off request's blocks under."""
    return f"handoff:{request_id}"


class DisaggScheduler(Scheduler):
    """``Scheduler`` with ``hold`` (a prefill worker's) and ``join`` (a decode worker's); see the
    module docstring. ``held``: request id -> the held block ids, in token order."""

    def __init__(self, *args, hold: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold = hold
        self.held: dict[str, tuple[int, ...]] = {}

    def _finish(self, request: Request, reason: str, now: float, detail: str = "") -> None:
        bm = self.block_manager
        if self.hold and reason == FinishReason.LENGTH and len(request.output_token_ids) == 1:
            table = bm.block_table(request.request_id)
            # a second reference to every block (all in use, so nothing new is taken and it cannot fail)
            if not bm.allocate(held_key(request.request_id), request.num_prompt_tokens, table):
                raise RuntimeError(f"{request.request_id}: could not hold its {len(table)} blocks")
            self.held[request.request_id] = table
        super()._finish(request, reason, now, detail)

    def release(self, request_id: str) -> None:
        """Free a held request's blocks (they join the free queue as a finished request's do);
        an id not held is ignored."""
        if self.held.pop(request_id, None) is not None:
            self.block_manager.free(held_key(request_id))

    def join(self, request: Request, now: float) -> None:
        """Add ``request`` (output_token_ids = [token 1], num_computed_tokens = prompt_len, blocks
        allocated under its id for prompt_len + 1 tokens) to the running set.

        Raises:
            ValueError: a request id already in use here, or one holding no blocks.
        """
        if request.request_id in self._requests:
            raise ValueError(f"request_id: {request.request_id!r} is already in use")
        if not self.block_manager.block_table(request.request_id):
            raise ValueError(f"{request.request_id}: join needs its blocks allocated first")
        self._requests[request.request_id] = request
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        self.running.append(request)
        self.block_manager.cache_computed_blocks(request)  # the prompt's full blocks: a prefix cache here too
