"""The simulator's batched paths give exactly what the simple ones give.

``Counters`` advances the GPUs it touches in two batches (those with a repair or
replacement in the interval, and the others), and
``Group.step`` builds only the rows of nodes that are up. Each is checked here against
the simple path it replaces, on a fleet with many failures, repairs and precursors.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.collectors.sim.counters import Counters

SPEC = FleetSpec(nodes=24, seed=11, failure_scale=60)


@pytest.fixture()
def sim():
    return FleetSimulator(SPEC, simulate_incidents(SPEC, days=3))


def tick_runs():
    """Advances of 1 tick and of many, over two days (repairs fall inside some)."""
    t, out = 0.0, []
    for i in range(400):
        T = 1 if i % 3 else 37
        out.append(t + 60.0 * np.arange(1, T + 1))
        t = out[-1][-1]
    return out


def test_counters_batched_path_equals_per_gpu_path(sim, monkeypatch):
    fast = sim.groups()[0].counters
    slow = FleetSimulator(SPEC, sim.plan).groups()[0].counters
    seen = {"gpus": 0, "nv_flit": 0, "episodes": 0, "repaired": 0, "replaced": 0}

    def per_gpu(self, gs, ticks, t_prev, eps, ep_g, benign, out, resets=None):
        """The reference: each GPU on its own grid, with the interval's resets (the
        same masks ``advance`` makes) when the batch is of GPUs that see one."""
        inside = (lambda t: (t > t_prev) & (t <= ticks[-1])) if resets is not None else (
            lambda t: np.zeros(len(t), bool))
        for g in gs.tolist():
            self._advance_gpu(g, ticks, t_prev, inside(self.reset_t), inside(self.repl_t),
                              eps, ep_g, benign, out)

    def counting(self, gs, ticks, t_prev, eps, ep_g, benign, out, resets=None):
        seen["gpus"] += len(gs)
        seen["nv_flit"] += int(np.isin(benign["nv_flit"][0], gs).sum())
        seen["episodes"] += int(np.isin(ep_g, gs).sum())
        if resets is not None:
            seen["repaired"] += int(np.isin(self.nodes_of[gs], resets[1]).sum())
            seen["replaced"] += int(np.isin(gs, resets[3]).sum())
        return Counters._advance_plain(self, gs, ticks, t_prev, eps, ep_g, benign, out,
                                       resets)

    monkeypatch.setattr(slow, "_advance_plain", per_gpu.__get__(slow))
    monkeypatch.setattr(fast, "_advance_plain", counting.__get__(fast))
    for ticks in tick_runs():
        a, b = fast.advance(ticks), slow.advance(ticks)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (k, ticks[0])
    for k in fast.state:
        assert np.array_equal(fast.state[k], slow.state[k]), k
    # the batched path did real work: benign NVLink events, precursor episodes, GPUs of
    # repaired nodes and replaced GPUs
    assert seen["gpus"] > 100 and seen["nv_flit"] > 0 and seen["episodes"] > 50
    assert seen["repaired"] > 20 and seen["replaced"] > 0, seen


def test_rows_of_down_nodes_are_the_full_rows_left_out(sim, monkeypatch):
    kept = sim.groups()[0]
    full = FleetSimulator(SPEC, sim.plan).groups()[0]
    monkeypatch.setattr(full, "down", lambda t: np.zeros((len(t), len(full.nodes)), bool))
    down_rows = flapped = 0
    for i, ticks in enumerate(tick_runs()):
        a = kept.step(ticks, np.random.default_rng([1, i]))
        b = full.step(ticks, np.random.default_rng([1, i]))
        keep = ~np.repeat(kept.down(ticks), kept.gpn, axis=1).ravel()
        down_rows += int((~keep).sum())
        flapped += int((~a["nvlink_up"]).sum())
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype, k
            assert np.array_equal(a[k], b[k][keep]), (k, ticks[0])
    assert down_rows > 1000 and flapped > 0


def test_batched_path_sums_overlapping_episodes_and_same_slot_events(sim):
    """Two episodes live on one GPU at once, and two NVLink events on one link in one
    tick (rare in a fleet, so made here by passing every episode and event twice)."""
    from fleetcare.collectors.sim.counters import _Rows

    a = sim.groups()[0].counters
    b = FleetSimulator(SPEC, sim.plan).groups()[0].counters
    ep = a.ep
    t_mid = float(np.median(ep.t1[a.ep_idx]))  # a time when some episodes are live
    ticks = t_mid + 3600.0 * np.arange(1, 25)  # a day: benign events of every kind
    for c in (a, b):
        c.advance(np.array([t_mid]))
    live = (ep.t0[a.ep_idx] < ticks[-1]) & (ep.t1[a.ep_idx] > t_mid)
    eps, ep_g = np.r_[a.ep_idx[live], a.ep_idx[live]], np.r_[a.ep_local[live], a.ep_local[live]]
    benign = {k: tuple(np.r_[x, x] for x in v) for k, v in a._benign(t_mid, ticks[-1]).items()}
    gs = np.unique(np.concatenate([ep_g] + [v[0] for v in benign.values()]))
    assert len(np.unique(ep_g)) >= 2 and all(len(v[0]) >= 2 for v in benign.values())
    out_a, out_b = _Rows(a.state, len(ticks), None), _Rows(b.state, len(ticks), None)
    a._advance_plain(gs, ticks, t_mid, eps, ep_g, benign, out_a)
    none = np.zeros(len(b.reset_t), bool), np.zeros(len(b.repl_t), bool)
    for g in gs.tolist():
        b._advance_gpu(g, ticks, t_mid, *none, eps, ep_g, benign, out_b)
    for k in out_a.cols:
        assert np.array_equal(out_a.cols[k], out_b.cols[k]), k
    assert all(out_a.cols[k].any() for k in ("nv_flit", "ce_v", "pcie"))
