"""Labels: did this GPU / node fail within the horizon after time t (INTERFACE STUB).

- ``FATAL_MODES`` / failure incidents: rows of ``incidents`` with kind = 'failure'
  (from the simulator's ground truth, fatal XIDs, lost GPUs, operators).
- ``attach_labels(store, keys, horizon_h=24)``: for a table with at least
  (ts, node, gpu_uuid), returns it with added columns
    label        bool   a failure blamed on this GPU within (ts, ts + H]
    node_label   bool   any failure of this node within (ts, ts + H]
    failure_ts   timestamp|null  the first such node failure
    failure_mode varchar|null    its mode ('hbm', 'thermal', ..., 'none')
    failure_cause varchar|null   its cause (Table 5 name)
  Application XIDs are never failures.
"""

from __future__ import annotations

import pyarrow as pa

from fleetcare.pipeline.store import Store


def attach_labels(store: Store, keys: pa.Table, horizon_h: float = 24.0) -> pa.Table:
    raise NotImplementedError
