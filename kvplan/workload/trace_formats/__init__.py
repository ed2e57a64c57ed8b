"""How a trace file's rows are read for replay (``dataset: {kind: trace}``), beside the Mooncake
reader in kvplan.workload.trace: columns (a trace's rows read through ``dataset.columns``, CSV or
JSONL, and the cells of the known CSV formats: times in s or ISO text, whole token counts)."""
