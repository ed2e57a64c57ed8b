"""The workload YAML: its schema and its reading, nothing that runs.

schema (Workload: engine, dataset, buckets, ``target:``, ``plan:``) with its parts: buckets
(buckets and datasets), lengths (token-length ranges, the strict base), request_class (a ``mix``'s
classes), arrivals (open-loop arrival processes and their offsets), sessions (``dataset.sessions``),
variants (engine variants), admission (per-tenant admission), deployment (a ``plan:`` entry: a GPU,
tp and the engine there), server (the ``target:`` section) and trace (a Mooncake-format trace file,
read and checked); file reads YAML -> schema -> the rules that span sections, each problem one
line naming the field.
"""
