"""Sampler: logits of the sampled rows -> one token id per request.

- greedy (temperature 0, or below 1e-5 as in vLLM): argmax, the first index on ties (as ``torch.argmax``
  and transformers' greedy search).
- temperature T > 0: softmax(logits / T), then top-p (nucleus sampling, Holtzman et al., "The
  Curious Case of Neural Text Degeneration", ICLR 2020): keep the most probable tokens until their
  mass reaches top_p (a token is dropped when the mass before it already reaches top_p; the most
  probable one always stays), renormalise, draw one.

Each non-greedy request draws from its own ``torch.Generator``, seeded by its ``seed`` or, when it
has none, by a seed taken from the sampler's own generator (seeded by ``EngineConfig.seed``) when
the request is added. So a request's draws never depend on its batch-mates or on the step in
which it runs, and a whole run is reproducible for a given engine seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.request import SamplingParams


class Sampler:
    """Keeps one generator seed (and, once used, one generator) per live non-greedy request."""

    def __init__(self, seed: int = 0):
        self._seed_source = torch.Generator().manual_seed(seed)
        self._seeds: dict[str, int] = {}
        self._generators: dict[str, torch.Generator] = {}

    def add(self, request_id: str, params: SamplingParams) -> None:
        """Register a request; takes its seed now (so the seed depends only on add order)."""
        if params.greedy:
            return
        if params.seed is not None:
            self._seeds[request_id] = params.seed
        else:
            self._seeds[request_id] = int(torch.randint(2**62, (1,), generator=self._seed_source))

    def free(self, request_id: str) -> None:
        self._seeds.pop(request_id, None)
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: Sequence[str], params: Sequence[SamplingParams]) -> list[int]:
        """logits: [num_sampled, vocab] fp32, row i for request_ids[i] with params[i].

        Returns one token id per row.

        Raises:
            KeyError: a non-greedy request that was never ``add``-ed.
        """
        token_ids = torch.argmax(logits, dim=-1).tolist()
        for i, (request_id, p) in enumerate(zip(request_ids, params)):
            if not p.greedy:
                token_ids[i] = self._draw(logits[i], p, self._generator(request_id, logits.device))
        return token_ids

    def _generator(self, request_id: str, device: torch.device) -> torch.Generator:
        g = self._generators.get(request_id)
        if g is None:
            g = torch.Generator(device=device).manual_seed(self._seeds[request_id])
            self._generators[request_id] = g
        return g

    @staticmethod
    def _draw(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
        """logits: [vocab] fp32 -> one id drawn from the temperature / top-p distribution."""
        probs = torch.softmax(logits / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs[mass_before >= p.top_p] = 0.0
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=generator))
