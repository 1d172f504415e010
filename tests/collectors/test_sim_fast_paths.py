"""The simulator's batched paths give exactly what the simple ones give.

``Counters`` advances the GPUs it touches in two batches (those with a repair or
replacement in the interval, and the others: on one time grid, or for a single tick
without one), and
``Group.step`` builds only the rows of nodes that are up. Each is checked here against
the simple path it replaces, on a fleet with many failures, repairs and precursors.
"""

from __future__ import annotations

import datetime as dt
import hashlib

import msgspec
import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.collectors.sim.counters import Counters, _Rows

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


def catch_ups():
    """Single ticks three hours apart over three days, as a history started late (or a
    live backend) catches its counters up: many repairs and replacements in each."""
    return [np.array([t]) for t in 3 * 3600.0 * np.arange(1, 25)]


@pytest.mark.parametrize("schedule", ["mixed", "catch_ups"])
def test_counters_batched_path_equals_per_gpu_path(sim, monkeypatch, schedule):
    fast = sim.groups()[0].counters
    slow = FleetSimulator(SPEC, sim.plan).groups()[0].counters
    seen = dict.fromkeys(("grid", "one_tick", "nv_flit", "episodes", "repaired_grid",
                          "repaired_one_tick", "replaced_grid", "replaced_one_tick"), 0)

    def per_gpu(self, gs, ticks, t_prev, eps, ep_g, benign, out, resets=None):
        """The reference: each GPU on its own grid, with the interval's resets (the
        same masks ``advance`` makes) when the batch is of GPUs that see one."""
        inside = (lambda t: (t > t_prev) & (t <= ticks[-1])) if resets is not None else (
            lambda t: np.zeros(len(t), bool))
        for g in gs.tolist():
            self._advance_gpu(g, ticks, t_prev, inside(self.reset_t), inside(self.repl_t),
                              eps, ep_g, benign, out)

    def count(self, gs, ep_g, benign, resets, path):
        seen[path] += len(gs)
        seen["nv_flit"] += int(np.isin(benign["nv_flit"][0], gs).sum())
        seen["episodes"] += int(np.isin(ep_g, gs).sum())
        if resets is not None:
            seen[f"repaired_{path}"] += int(np.isin(self.nodes_of[gs], resets[1]).sum())
            seen[f"replaced_{path}"] += int(np.isin(gs, resets[3]).sum())

    def counting(self, gs, ticks, t_prev, eps, ep_g, benign, out, resets=None):
        count(self, gs, ep_g, benign, resets, "grid")
        return Counters._advance_plain(self, gs, ticks, t_prev, eps, ep_g, benign, out,
                                       resets)

    def tick_per_gpu(self, gs, t_end, t_prev, eps, ep_g, benign, resets=None):
        per_gpu(self, gs, np.array([t_end]), t_prev, eps, ep_g, benign,
                _Rows(self.state, 1, None), resets)

    def tick_counting(self, gs, t_end, t_prev, eps, ep_g, benign, resets=None):
        count(self, gs, ep_g, benign, resets, "one_tick")
        return Counters._advance_tick(self, gs, t_end, t_prev, eps, ep_g, benign, resets)

    monkeypatch.setattr(slow, "_advance_plain", per_gpu.__get__(slow))
    monkeypatch.setattr(slow, "_advance_tick", tick_per_gpu.__get__(slow))
    monkeypatch.setattr(fast, "_advance_plain", counting.__get__(fast))
    monkeypatch.setattr(fast, "_advance_tick", tick_counting.__get__(fast))
    for ticks in tick_runs() if schedule == "mixed" else catch_ups():
        a, b = fast.advance(ticks), slow.advance(ticks)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (k, ticks[0])
    for k in fast.state:
        assert np.array_equal(fast.state[k], slow.state[k]), k
    # the batched paths did real work: on the grid and one tick at a time, benign
    # NVLink events, precursor episodes, GPUs of repaired nodes and replaced GPUs
    assert seen["nv_flit"] > 0 and seen["episodes"] > 50, seen
    if schedule == "mixed":
        assert seen["grid"] > 100 and seen["one_tick"] > 100, seen
        assert seen["repaired_grid"] > 20 and seen["replaced_grid"] > 0, seen
    else:
        assert seen["repaired_one_tick"] > 20 and seen["replaced_one_tick"] > 0, seen


def test_rows_of_down_nodes_are_the_full_rows_left_out(sim, monkeypatch):
    kept = sim.groups()[0]
    full = FleetSimulator(SPEC, sim.plan).groups()[0]
    monkeypatch.setattr(full, "down", lambda t: np.zeros((len(t), len(full.nodes)), bool))
    down_rows = flapped = 0
    paths = {"up_gpus_only": 0, "masked": 0}  # how the rows were left out (``Computed``)
    for i, ticks in enumerate(tick_runs()):
        a = kept.step(ticks, np.random.default_rng([1, i]))
        b = full.step(ticks, np.random.default_rng([1, i]))
        keep = ~np.repeat(kept.down(ticks), kept.gpn, axis=1).ravel()
        down_rows += int((~keep).sum())
        if not keep.all():
            sub = kept.layout(len(ticks), keep.reshape(len(ticks), -1))[2]
            paths["up_gpus_only" if sub.mask is None else "masked"] += 1
        flapped += int((~a["nvlink_up"]).sum())
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype, k
            assert np.array_equal(a[k], np.asarray(b[k])[keep]), (k, ticks[0])
    assert down_rows > 1000 and flapped > 0
    assert paths["up_gpus_only"] > 50 and paths["masked"] > 5, paths


@pytest.mark.parametrize("what", ["flap", "hot"])
@pytest.mark.parametrize("ticks_after", [(0.0,), (0.0, 10.0), (0.0, 60.0, 120.0)])
def test_a_gpu_flapping_or_hot_on_a_down_node_has_no_row(sim, monkeypatch, what, ticks_after):
    """A flap or a live precursor (a hot GPU's) on a GPU whose node is down (a plan may
    overlap a failure's down time with another GPU's episode: rare, so made here) touch
    no row, whether only the up nodes' GPUs are computed (one tick, or the same nodes
    down at every tick) or every GPU with the rows masked (the node comes back
    mid-step)."""
    from fleetcare.collectors.sim.episodes import HOT_GPU, THERMAL

    kept = sim.groups()[0]
    full = FleetSimulator(SPEC, sim.plan).groups()[0]
    monkeypatch.setattr(full, "down", lambda t: np.zeros((len(t), len(full.nodes)), bool))
    ep = sim.episodes
    if what == "flap":
        i = int(np.flatnonzero(kept.local[ep.flap_gpu] >= 0)[0])
        t, gpu = float(ep.flap_t[i]), int(ep.flap_gpu[i])
    else:
        i = int(np.flatnonzero((kept.local[ep.gpu] >= 0) & np.isin(ep.kind, (THERMAL, HOT_GPU))
                               & (ep.t1 - ep.t0 > 600))[0])
        t, gpu = float(ep.t1[i] - 300.0), int(ep.gpu[i])
    node = int(kept.local[gpu] // kept.gpn)
    # the node is down from well before ``t`` until just after it
    kept.down_t0 = np.r_[kept.down_t0, t - 3600.0]
    kept.down_t1 = np.r_[kept.down_t1, t + 30.0]
    kept.down_node = np.r_[kept.down_node, node]
    ticks = t + 10.0 + np.array(ticks_after)
    for grp in (kept, full):
        grp.counters.advance(np.array([ticks[0] - 60.0]))
    a = kept.step(ticks, np.random.default_rng(5))
    b = full.step(ticks, np.random.default_rng(5))
    keep = ~np.repeat(kept.down(ticks), kept.gpn, axis=1).ravel()
    assert not keep.all()
    for k in a:
        assert np.array_equal(a[k], np.asarray(b[k])[keep]), k
    if what == "flap":
        assert not np.asarray(b["nvlink_up"]).all()


@pytest.mark.parametrize("one_tick", [False, True])
def test_batched_path_sums_overlapping_episodes_and_same_slot_events(sim, one_tick):
    """Two episodes live on one GPU at once, and two NVLink events on one link in one
    tick (rare in a fleet, so made here by passing every episode and event twice), on
    the time-grid path (a day of hourly ticks) and the one-tick path (a day at once)."""
    a = sim.groups()[0].counters
    b = FleetSimulator(SPEC, sim.plan).groups()[0].counters
    ep = a.ep
    t_mid = float(np.median(ep.t1[a.ep_idx]))  # a time when some episodes are live
    ticks = t_mid + 3600.0 * np.arange(1, 25)  # a day: benign events of every kind
    if one_tick:
        ticks = ticks[-1:]
    for c in (a, b):
        c.advance(np.array([t_mid]))
    live = (ep.t0[a.ep_idx] < ticks[-1]) & (ep.t1[a.ep_idx] > t_mid)
    eps, ep_g = np.r_[a.ep_idx[live], a.ep_idx[live]], np.r_[a.ep_local[live], a.ep_local[live]]
    benign = {k: tuple(np.r_[x, x] for x in v) for k, v in a._benign(t_mid, ticks[-1]).items()}
    gs = np.unique(np.concatenate([ep_g] + [v[0] for v in benign.values()]))
    assert len(np.unique(ep_g)) >= 2 and all(len(v[0]) >= 2 for v in benign.values())
    out_a, out_b = _Rows(a.state, len(ticks), None), _Rows(b.state, len(ticks), None)
    if one_tick:
        a._advance_tick(gs, float(ticks[-1]), t_mid, eps, ep_g, benign)
    else:
        a._advance_plain(gs, ticks, t_mid, eps, ep_g, benign, out_a)
    none = np.zeros(len(b.reset_t), bool), np.zeros(len(b.repl_t), bool)
    for g in gs.tolist():
        b._advance_gpu(g, ticks, t_mid, *none, eps, ep_g, benign, out_b)
    cols_a, cols_b = out_a.finish(a.nonzero), out_b.finish(b.nonzero)
    for k in cols_a:
        assert np.array_equal(cols_a[k], cols_b[k]), k
    for k in a.state:
        assert np.array_equal(a.state[k], b.state[k]), k
    assert all(np.asarray(cols_a[k]).any() for k in ("nv_flit", "ce_v", "pcie"))


def test_counters_from_their_non_zero_gpus_are_the_rows_of_the_whole_state(sim, monkeypatch):
    """A one-tick advance gives each counter from the state after it, the per-link
    counters as ``SparseLinks`` of the GPUs whose state is not zero (``Counters.nonzero``);
    a longer one builds the per-link counters from the non-zero GPUs' prior state and
    what changed. Every column must equal the rows copied from the whole state (after a
    one-tick advance: the state itself), over advances of one tick and of many, with
    down nodes: a stale ``nonzero`` would leave a GPU's counts out."""
    import fleetcare.collectors.sim.counters as counters
    from fleetcare.collectors.sim.sparse_links import SparseLinks

    def run() -> list[dict]:
        grp = FleetSimulator(SPEC, sim.plan).groups()[0]
        out = []
        for ticks in tick_runs():
            keep = ~np.repeat(grp.down(ticks), grp.gpn, axis=1)
            keep = None if keep.all() else keep
            kept = grp.layout(len(ticks), keep)[0]  # (as a step passes it)
            out.append(grp.counters.advance(ticks, keep, kept))
        return out

    sparse = run()
    # one-tick scalar columns: shared with the last tick's when no GPU of theirs moved,
    # else copied from it with the moved GPUs' rows written (same rows both ticks)
    shared = sum(a[k] is b[k] for a, b in zip(sparse, sparse[1:], strict=False) for k in a
                 if k not in counters.LINK_COUNTERS)
    assert shared > 500

    class Dense(counters._Rows):  # every row copied from the state, as before
        def __init__(self, state, T, keep, nonzero=None, kept=None):
            super().__init__(state, T, keep, None, kept)

        def finish(self, nonzero, last=None, moved=None):
            if self.T > 1:
                return super().finish(nonzero)
            kept = np.arange(self.G) if self.keep is None else np.flatnonzero(self.keep[0])
            return {name: st[kept] for name, st in self.state.items()}

    monkeypatch.setattr(counters, "_Rows", Dense)
    dense = run()
    held = {1: 0, 37: 0}
    nonzero_scalars = 0
    for ticks, a, b in zip(tick_runs(), sparse, dense, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert isinstance(b[k], np.ndarray) and a[k].dtype == b[k].dtype, k
            if k not in counters.LINK_COUNTERS:
                assert isinstance(a[k], np.ndarray) and np.array_equal(a[k], b[k]), k
                assert len(ticks) > 1 or not a[k].flags.writeable, k
                nonzero_scalars += int(np.count_nonzero(b[k])) * (len(ticks) == 1)
                continue
            assert isinstance(a[k], SparseLinks) and a[k].dtype == counters.LINK_DTYPE
            assert np.array_equal(a[k].dense(), b[k]), k
            assert np.array_equal(a[k].rows, np.flatnonzero(b[k].any(axis=1))), k
        held[len(ticks)] += len(a["nv_flit"].rows)
    assert min(held.values()) > 500 and nonzero_scalars > 10_000, (held, nonzero_scalars)


def test_one_tick_columns_are_not_reused_across_a_longer_advance(sim):
    """The last one-tick columns are reused only by the next one-tick advance of the
    same rows: an advance of several ticks between them (which moves the state without
    recording it for the one-tick columns) drops them, even though the caller's kept
    rows are the same object."""
    grp = sim.groups()[0]
    c = grp.counters
    day = 86400.0
    keep = ~np.repeat(grp.down(np.array([day])), grp.gpn, axis=1)
    kept = grp.layout(1, keep)[0]
    first = c.advance(np.array([day]), keep, kept)
    c.advance(day + 3600.0 * np.arange(1, 13), np.tile(keep, (12, 1)))  # half a day
    again = c.advance(np.array([day + 13 * 3600.0]), keep, kept)
    rows = np.flatnonzero(keep[0])
    moved = 0
    for name in ("ce_v", "ce_a", "pcie", "rr_c"):
        assert np.array_equal(again[name], c.state[name][rows]), name
        moved += int((again[name] != first[name]).sum())
    assert moved > 0


def test_identity_columns_are_shared_read_only(sim):
    """The identity and constant columns of a one-tick chunk are given as they are (or
    as kept last time), so no consumer may write them; ``nvlink_up`` too until a link
    flaps, and then the chunk has its own."""
    grp = sim.groups()[0]
    a = grp.step(np.array([60.0]), np.random.default_rng(1))
    b = grp.step(np.array([120.0]), np.random.default_rng(2))
    for k in ("node", "gpu_uuid", "gpu_index", "pci_bus_id", "model", "power_limit_w",
              "mem_clock_mhz", "fb_total_mib", "pcie_link_gen_max", "pcie_link_width_max",
              "nvlink_up"):
        assert not a[k].flags.writeable and np.array_equal(a[k], b[k]), k
        assert a[k] is b[k], k
        with pytest.raises(ValueError, match="read-only"):
            a[k][0] = a[k][1]
    assert a["nvlink_up"].all()
    flap = int(np.flatnonzero(grp.local[sim.episodes.flap_gpu] >= 0)[0])
    t = float(sim.episodes.flap_t[flap])
    c = grp.step(np.array([t, t + 60.0]), np.random.default_rng(3))
    d = grp.step(np.array([t + 7200.0, t + 7260.0]), np.random.default_rng(4))
    assert not c["nvlink_up"].all() and c["nvlink_up"].flags.writeable
    assert d["nvlink_up"].all() and not d["nvlink_up"].flags.writeable


def test_job_blocks_drawn_again_only_where_they_changed(sim):
    """One tick of every node re-hashes only the nodes whose 6-hour job block changed
    since the last such tick (``Group._block_draws``); over two days of ticks (every
    node crosses blocks) it equals drawing every node's block afresh."""
    grp = sim.groups()[0]
    every = np.arange(len(grp.nodes))
    crossed = 0
    for t in 600.0 * np.arange(1, 300):
        busy, inten = grp.jobs(np.array([t]))  # cached path
        busy_ref, inten_ref = grp.jobs(np.array([t]), every)  # drawn afresh
        assert np.array_equal(busy, busy_ref) and np.array_equal(inten, inten_ref), t
        crossed += int((grp._blocks[0] != np.floor(
            (t - 600 + grp.phase) / 21600.0)).sum())
    assert crossed > len(grp.nodes)  # blocks did change under the cache


def test_busy_and_up_of_pairs_is_what_jobs_and_down_say(sim):
    """Application XIDs land on (time, node) pairs that run a job and are up: the
    vectorised check equals asking ``jobs`` and ``down`` one pair at a time, over
    two days with repairs (some pairs fall on down nodes)."""
    grp = sim.groups()[0]
    rng = np.random.default_rng(3)
    t = rng.uniform(0, 3 * 86400, 3000)
    n = rng.integers(0, len(grp.nodes), 3000)
    ref = np.array([bool(grp.jobs(np.array([tt]), np.array([nn]))[0][0, 0])
                    and not grp.down(np.array([tt]))[0, nn]
                    for tt, nn in zip(t.tolist(), n.tolist(), strict=True)])
    got = grp.busy_and_up(t, n)
    assert np.array_equal(got, ref)
    down = np.array([grp.down(np.array([tt]))[0, nn] for tt, nn in zip(t, n, strict=True)])
    assert down.sum() > 10 and ref.sum() > 1000  # both branches were taken


def test_down_marks_each_tick_of_every_repair(sim):
    """``down`` over many ticks equals marking each repair interval in turn, and one
    tick at a time (repairs start and end inside the ticks)."""
    grp = sim.groups()[0]
    ticks = 300.0 * np.arange(0, 864)
    ref = np.zeros((len(ticks), len(grp.nodes)), dtype=bool)
    for t0, t1, node in zip(grp.down_t0, grp.down_t1, grp.down_node, strict=True):
        ref[(ticks >= t0) & (ticks < t1), node] = True
    assert ref.sum() > 100
    assert np.array_equal(grp.down(ticks), ref)
    assert np.array_equal(ref, np.vstack([grp.down(ticks[i:i + 1]) for i in range(len(ticks))]))


HISTORY_DIGEST = "04b776ebd991e9c4c376fb82aac044e9a41771f6ac5dc3466a3fef26128d539c"
"""What the simulator drew before its fast paths (the shipped prior, its threshold and the
README's pool figures were simulated with these draws). Computed with the code of
2026-12-04 and with this one."""


def history_digest(sim: FleetSimulator, ranges) -> str:
    """sha256 of every sample column, XID event and incident of ``sim.history`` over
    ``ranges`` ((start, end, interval_s), ...)."""
    h = hashlib.sha256()
    for a, b, step in ranges:
        for ch in sim.history(a, b, interval_s=step):
            for k in sorted(ch.samples):
                v = np.asarray(ch.samples[k])  # (per-link counters: SparseLinks)
                if v.dtype == object:
                    h.update("\x1f".join(map(str, v.tolist())).encode())
                elif v.dtype.kind == "M":
                    h.update(v.astype("datetime64[us]").astype(np.int64).tobytes())
                else:
                    h.update(v.astype(np.float64 if v.dtype.kind == "f" else np.int64).tobytes())
            h.update(msgspec.json.encode(ch.events) + msgspec.json.encode(ch.incidents))
    return h.hexdigest()


def test_history_draws_are_what_they_were():
    """Speed-ups of the simulator must not change a single value: every sample column,
    XID event and incident of a mixed-model fleet with failures and repairs (60-s
    ticks late in its life, with nodes down) hashes as before. numpy's float functions
    can differ by an ulp on another CPU; there, recompute the digest with the older
    code first."""
    spec = FleetSpec(nodes=24, seed=7, failure_scale=40, model="H100:3,A100:1")
    sim = FleetSimulator(spec, simulate_incidents(spec, days=3))
    late = spec.start + dt.timedelta(days=2)
    assert history_digest(sim, ((spec.start, spec.start + dt.timedelta(days=2), 300),
                                (late, late + dt.timedelta(minutes=20), 60))) == HISTORY_DIGEST


CATCH_UP_DIGEST = "70e5d07fdb65215052cccc58e98a7ab5828a59bc1e19011d3b8d0d91cefdd0f8"
"""A larger fleet's history three days in, computed with the code of 2026-12-04
(0710830), of 2026-12-05 before the catch-up's sorted adds (2ebc2c9) and with this one."""


def test_a_catch_up_draws_what_it_did(monkeypatch):
    """The digest above is too small a fleet for the catch-up's batched adds and counts
    (they start at a few dozen rows): a 160-node fleet's history starting three days in
    goes through both, and hashes as before."""
    from fleetcare.collectors.sim import counters as C

    used = {"rows": 0, "counts": 0}
    real_rows, real_counts = C._add_rows, C._count_at

    def rows(a, r, v):
        used["rows"] += len(r) >= 32
        real_rows(a, r, v)

    def counts(a, index):
        used["counts"] += len(index[0]) >= 64
        real_counts(a, index)

    monkeypatch.setattr(C, "_add_rows", rows)
    monkeypatch.setattr(C, "_count_at", counts)
    spec = FleetSpec(nodes=160, seed=13, failure_scale=60, model="H100:3,A100:1")
    sim = FleetSimulator(spec, simulate_incidents(spec, days=5))
    day3 = spec.start + dt.timedelta(days=3)
    digest = history_digest(sim, ((day3, day3 + dt.timedelta(minutes=20), 60),))
    assert used["rows"] and used["counts"]
    assert digest == CATCH_UP_DIGEST


def test_history_left_early_ends_its_draw_thread(sim):
    """``history`` draws ahead on a second thread (the fleet's traits and days, the next
    chunk's noise); a consumer that stops early (closes the generator) leaves no thread
    behind."""
    import threading
    import time

    def draw_threads() -> int:
        return sum(t.name.startswith("fleetcare-sim-draws") for t in threading.enumerate())

    chunks = sim.history(SPEC.start, SPEC.start + dt.timedelta(days=2), interval_s=60)
    next(chunks), next(chunks)
    assert draw_threads() == 1
    chunks.close()
    deadline = time.monotonic() + 5
    while draw_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert draw_threads() == 0


def test_a_healthy_fleet_advances_with_no_gpu_to_move():
    """Regression (`fleetcare simulate --nodes 2 --days 4 --failure-scale 0 --interval 30m`
    failed: "cannot reshape array of size 0"): with no precursor and few benign events,
    advances see batches where no GPU's per-link counters move; every counter still
    only grows between repairs."""
    spec = FleetSpec(nodes=2, seed=1, failure_scale=0)
    sim = FleetSimulator(spec, simulate_incidents(spec, days=4))
    chunks = list(sim.history(spec.start, spec.start + dt.timedelta(days=4), interval_s=1800))
    assert sum(len(c) for c in chunks) == 2 * 8 * 4 * 48
    ce = np.concatenate([c.samples["ecc_corrected_aggregate"] for c in chunks]).reshape(-1, 16)
    assert (np.diff(ce, axis=0) >= 0).all()


def test_row_adds_and_counts_equal_numpys_add_at():
    """``counters._add_rows`` / ``_count_at`` stand in for ``np.add.at`` (slow per row):
    the same sums with repeated rows, all distinct rows, or none at all, on both sides
    of their thresholds (a few dozen rows), and on a non-contiguous array."""
    from fleetcare.collectors.sim.counters import _add_rows, _count_at

    rng = np.random.default_rng(3)
    for n, unique in ((0, False), (1, False), (5, False), (200, False), (40, True), (200, True)):
        for shape in ((250, 3), (250, 3, 18)):
            rows = rng.permutation(250)[:n] if unique else rng.integers(0, 50, n)
            v = rng.integers(0, 9, (n, *shape[1:]))
            want, got = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
            np.add.at(want, rows, v)
            _add_rows(got, rows, v)
            np.testing.assert_array_equal(got, want)
            index = tuple(rng.integers(0, k, n) for k in shape)
            want, got = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
            np.add.at(want, index, 1)
            _count_at(got, index)
            np.testing.assert_array_equal(got, want)
    index = (rng.integers(0, 50, 300), rng.integers(0, 3, 300))
    want, got = np.zeros((3, 50), np.int64).T, np.zeros((3, 50), np.int64).T  # (50, 3) views
    np.add.at(want, index, 1)
    _count_at(got, index)
    np.testing.assert_array_equal(got, want)
