"""``/metrics`` of a prefill or decode server (``python -m engine.serve --role``): the aggregated
server's metrics (engine.serve.metrics, vLLM's names: the role's own pool, running, waiting) plus
the handoffs and the KV that moved.

vLLM names its transfer metrics only per connector (NIXL's ``vllm:nixl_*``), so these carry the
engine's own ``kvplan_`` prefix::

    prefill role
    kvplan_handoffs_held                gauge    finished prefills whose blocks wait to be taken
    kvplan_kv_exported_blocks_total     counter  blocks read out for a decode server
    kvplan_kv_exported_bytes_total      counter  bytes of those blocks (blocks x bytes_per_block)
    decode role
    kvplan_handoffs_waiting             gauge    handoffs queued here, not admitted (FIFO)
    kvplan_handoffs_in_transfer         gauge    admitted handoffs whose KV has not arrived yet
    kvplan_kv_imported_blocks_total     counter  blocks written in from a prefill server
    kvplan_kv_imported_bytes_total      counter  bytes of those blocks
    kvplan_kv_transfer_seconds          histogram  per handoff: admission -> its KV written here
                                                   (fetch over HTTP + import), seconds
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from engine.serve.metrics import ServeMetrics

# seconds: 0.1 ms .. 10 s, a localhost HTTP fetch of a few blocks up to a long prompt over a slow link
TRANSFER_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class DisaggMetrics(ServeMetrics):
    """``ServeMetrics`` plus the metrics of ``role`` (prefill | decode) listed in the module
    docstring. Raises ValueError for another role."""

    def __init__(self, model_name: str, role: str, **pool):
        super().__init__(model_name, **pool)
        if role not in ("prefill", "decode"):
            raise ValueError(f"role: must be prefill or decode (got {role!r})")
        self.role = role
        r, labels = self.registry, ["model_name"]
        if role == "prefill":
            self.held = Gauge(
                "kvplan_handoffs_held", "Finished prefills whose blocks wait for a decode server.", labels, registry=r
            ).labels(model_name)
            self.blocks = Counter(
                "kvplan_kv_exported_blocks", "KV blocks read out for a decode server.", labels, registry=r
            ).labels(model_name)
            self.bytes = Counter(
                "kvplan_kv_exported_bytes", "Bytes of the KV blocks read out.", labels, registry=r
            ).labels(model_name)
        else:
            self.handoffs_waiting = Gauge(
                "kvplan_handoffs_waiting", "Handoffs queued, not admitted.", labels, registry=r
            ).labels(model_name)
            self.in_transfer = Gauge(
                "kvplan_handoffs_in_transfer", "Admitted handoffs whose KV has not arrived.", labels, registry=r
            ).labels(model_name)
            self.blocks = Counter(
                "kvplan_kv_imported_blocks", "KV blocks written in from a prefill server.", labels, registry=r
            ).labels(model_name)
            self.bytes = Counter(
                "kvplan_kv_imported_bytes", "Bytes of the KV blocks written in.", labels, registry=r
            ).labels(model_name)
            self.transfer_seconds = Histogram(
                "kvplan_kv_transfer_seconds",
                "Seconds from a handoff's admission to its KV written here.",
                labels,
                buckets=TRANSFER_BUCKETS,
                registry=r,
            ).labels(model_name)

    def observe_moved(self, num_blocks: int, num_bytes: int, seconds: float | None = None) -> None:
        """One request's blocks moved out (prefill) or in (decode, with its transfer ``seconds``)."""
        self.blocks.inc(num_blocks)
        self.bytes.inc(num_bytes)
        if seconds is not None and self.role == "decode":
            self.transfer_seconds.observe(seconds)


def merge_expositions(texts: list[tuple[str, str]]) -> str:
    """One Prometheus text exposition of several servers': ``texts`` is [(server label, its
    /metrics text)]; every sample gains the label ``server`` (a name several servers expose is one
    family with a label set per server, as a data-parallel vLLM exposes its engines). The router's
    /metrics (engine.serve.router). Raises ValueError: a text that is not Prometheus' format."""
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.utils import floatToGoString

    families: dict[str, tuple[str, str, list[str]]] = {}  # TYPE-line name -> (type, help, sample lines)
    for server, text in texts:
        for family in text_string_to_metric_families(text):
            key = f"{family.name}_total" if family.type == "counter" else family.name
            kind = "gauge" if family.type == "info" else family.type
            lines = families.setdefault(key, (kind, family.documentation, []))[2]
            for sample in family.samples:
                labels = {**sample.labels, "server": server}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                lines.append(f"{sample.name}{{{body}}} {floatToGoString(sample.value)}")
    out = []
    for key, (kind, doc, lines) in families.items():
        out += [f"# HELP {key} {_escape(doc)}", f"# TYPE {key} {kind}", *lines]
    return "\n".join(out) + "\n" if out else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
