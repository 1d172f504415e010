"""Cumulative reliability counters of a group of simulated GPUs, advanced tick by tick.

A counter's value at tick ``t`` is its value at the previous advance plus what happened
in between: benign events (sparse Poisson, per-GPU rates) and precursor curves
(``Episodes.cumulative``). Volatile counters (ECC volatile, PCIe replay, NVLink) reset
when the node is repaired (rebooted); aggregate ones (ECC aggregate, remapped rows)
only when the GPU is replaced. Only GPUs touched by an event, an episode or a reset are
computed; all others repeat their state, so a tick costs O(GPUs). The touched GPUs are
computed together on one time grid (``_advance_plain``), those with a repair or
replacement in the interval in a second batch whose grid holds those times; an advance
of one tick (every chunk of a fleet past 65,536 GPUs, and a late history's catch-up)
computes the same integers without a grid (``_advance_tick``). The per-GPU path
(``_advance_gpu``, each GPU on its own grid) is the reference all must equal
(tests/collectors/test_sim_fast_paths.py).

Benign events are a fixed function of (seed, day): each day's events of the whole fleet
are drawn from a generator seeded by the day alone, then this group keeps its GPUs'. So
a counter's value at time ``t`` does not depend on how the ticks before it were grouped
into advances: a live backend started at ``t`` reads exactly what the history read at
``t`` (hardware counters do not jump when an agent restarts, and neither do these).
"""

from __future__ import annotations

import numpy as np

from fleetcare.collectors.sim.draws import DAY_S, Day, FleetDraws
from fleetcare.collectors.sim.episodes import LINK_COUNTERS, Episodes
from fleetcare.collectors.sim.row_take import RowTake
from fleetcare.collectors.sim.sparse_links import Column, SparseLinks

VOLATILE = ("ce_v", "ue_v", "pcie", *LINK_COUNTERS)
AGGREGATE = ("ce_a", "ue_a", "rr_c", "rr_u")
_INTO = {"ce": ("ce_v", "ce_a"), "ue": ("ue_v", "ue_a")}
"""The counters an episode curve or benign kind adds to, where not its own name."""
LINK_DTYPE = np.int32
"""Per-link counters are held and given out as int32 (an episode adds at most tens of
thousands; NVML's are 64-bit, and the store widens them): they are most of a tick's
bytes (100,000 GPUs × 18 links × 4 counters), and half the bytes is half the copying."""


class Counters:
    def __init__(self, *, gpus: np.ndarray, local_of: np.ndarray, nodes_of: np.ndarray,
                 nlinks: int, episodes: Episodes, resets: tuple[np.ndarray, np.ndarray],
                 replacements: tuple[np.ndarray, np.ndarray], draws: FleetDraws) -> None:
        """``gpus``: fleet indices; ``local_of``: each fleet GPU's index in ``gpus``, -1
        for others; ``nodes_of``: local node of each; ``resets``: (time, local node) of
        repairs; ``replacements``: (time, local gpu); ``draws``: the fleet's traits and
        benign days."""
        self.gpus = gpus
        self.nodes_of = nodes_of
        self.G = len(gpus)
        self.N = int(nodes_of.max()) + 1 if len(nodes_of) else 0
        self.L = nlinks
        self.ep = episodes
        self.local_of = local_of
        self.ep_idx = np.flatnonzero(local_of[episodes.gpu] >= 0)
        self.ep_local = local_of[episodes.gpu[self.ep_idx]]
        self.reset_t, self.reset_node = resets
        self.repl_t, self.repl_gpu = replacements
        self.draws = draws
        self._days: dict[int, Day] = {}
        self.t = 0.0
        # the last one-tick advance's scalar columns with the rows they were of
        # (``_Rows.finish``)
        self._last: tuple[object, dict[str, np.ndarray]] | None = None
        links = {name: np.zeros((self.G, nlinks), dtype=LINK_DTYPE) for name in LINK_COUNTERS}
        traits = draws.errors()  # (may still be being drawn: asked for last)
        self.kinds = tuple(traits.cum)
        z = np.zeros(self.G, dtype=np.int64)
        self.state: dict[str, np.ndarray] = {
            "ce_v": z.copy(), "ue_v": z.copy(), "pcie": z.copy(),
            "ce_a": traits.life_ce[gpus].astype(np.int64), "ue_a": z.copy(),
            "rr_c": traits.life_rr[gpus], "rr_u": z.copy(), **links,
        }
        # per-link counters: whether each GPU's is not zero (few are: ``_Rows``)
        self.nonzero = {name: np.zeros(self.G, dtype=bool) for name in LINK_COUNTERS}
        # the GPUs whose state each counter wrote in the current advance
        self._moved: dict[str, list[np.ndarray]] = {name: [] for name in self.state}

    def _day(self, day: int) -> Day:
        """This group's benign events of ``day``: {kind: (local gpu, t, link)}, cached."""
        got = self._days.get(day)
        if got is not None:
            return got
        out = {}
        for name, (g, t, link) in self.draws.day(day).items():
            local = self.local_of[g]
            keep = (local >= 0) & (link < self.L) if name == "nv_flit" else local >= 0
            out[name] = (local[keep], t[keep], link[keep])
        if len(self._days) >= 4:  # ticks move forward: old days are not asked again
            self._days.pop(min(self._days))
        self._days[day] = out
        return out

    def _benign(self, t_prev: float, t_end: float) -> dict:
        """Benign events with ``t_prev < t <= t_end``: {kind: (local gpu, t, link)}."""
        days = range(int(t_prev // DAY_S), int(t_end // DAY_S) + 1)
        parts = [self._day(d) for d in days]
        out = {}
        for name in self.kinds:
            g, t, link = (np.concatenate([p[name][i] for p in parts]) for i in range(3))
            sel = (t > t_prev) & (t <= t_end)
            out[name] = (g[sel], t[sel], link[sel])
        return out

    def advance(self, ticks: np.ndarray, keep: np.ndarray | None = None,
                kept: tuple[RowTake, np.ndarray] | None = None) -> dict[str, Column]:
        """Values at ``ticks`` (seconds, increasing, > previous) of the rows ``keep``
        (bool (T, G); default all), tick-major: {name: (rows,)}, the per-link counters as
        ``SparseLinks`` (rows, L); ``kept``: ``kept_rows(keep)`` when the caller holds it,
        the same object for as long as ``keep`` is the same (one-tick columns then start
        from the last ones: ``_Rows.finish``). The state advances for every GPU whatever
        ``keep`` says."""
        t_prev, t_end = self.t, float(ticks[-1])
        T = len(ticks)
        benign = self._benign(t_prev, t_end)
        ep = self.ep
        live = (ep.t0[self.ep_idx] < t_end) & (ep.t1[self.ep_idx] > t_prev)
        eps, ep_g = self.ep_idx[live], self.ep_local[live]
        rs = (self.reset_t > t_prev) & (self.reset_t <= t_end)
        reset_gpus = np.flatnonzero(np.isin(self.nodes_of, self.reset_node[rs]))
        rp = (self.repl_t > t_prev) & (self.repl_t <= t_end)
        mark = np.zeros(self.G, dtype=bool)  # (a sort of ~40,000 indices at a catch-up)
        for gs in (ep_g, reset_gpus, self.repl_gpu[rp], *(b[0] for b in benign.values())):
            mark[gs] = True
        special = np.flatnonzero(mark)
        # more ticks: every row starts as its GPU's state before this advance, and the
        # special GPUs' rows are overwritten with their own values; one tick: the rows
        # are the state after it (``_Rows``)
        last, self._last = self._last, None  # (none kept if this advance fails)
        self._moved = {name: [] for name in self.state}
        out = _Rows(self.state, T, keep,
                    {name: np.flatnonzero(self.nonzero[name]) for name in LINK_COUNTERS}, kept)
        # GPUs with no repair or replacement in (t_prev, t_end] share one time grid; those
        # with one are computed together on a grid that also holds the reset times
        touched = np.isin(special, reset_gpus) | np.isin(special, self.repl_gpu[rp])
        resets = (self.reset_t[rs], self.reset_node[rs], self.repl_t[rp], self.repl_gpu[rp])
        if T == 1:  # (every chunk of a fleet past 65,536 GPUs, and its catch-up)
            self._advance_tick(special[~touched], t_end, t_prev, eps, ep_g, benign)
            self._advance_tick(special[touched], t_end, t_prev, eps, ep_g, benign, resets)
        else:
            self._advance_plain(special[~touched], ticks, t_prev, eps, ep_g, benign, out)
            self._advance_plain(special[touched], ticks, t_prev, eps, ep_g, benign, out,
                                resets=resets)
        self.t = t_end
        # one tick's scalar columns start from the last one-tick advance's when its rows
        # were the same (``kept`` is the caller's, the same object while the same nodes
        # are up)
        rows = _EVERY_ROW if keep is None else kept
        last = last if T == 1 and last and last[0] is rows else None
        cols = out.finish(self.nonzero, None if last is None else last[1], self._moved)
        self._last = None if T > 1 or rows is None else (rows, {
            name: col for name, col in cols.items() if isinstance(col, np.ndarray)
            and name not in self.nonzero})
        return cols

    def _advance_gpu(self, g: int, ticks: np.ndarray, t_prev: float, rs: np.ndarray,
                     rp: np.ndarray, eps: np.ndarray, ep_g: np.ndarray, benign: dict,
                     out: _Rows) -> None:
        """``advance`` for one GPU, on its own time grid: the ticks plus the repairs
        (``rs``) and replacements (``rp``) in the interval, which reset its counters."""
        ep = self.ep
        node = self.nodes_of[g]
        r_vol = self.reset_t[rs & (self.reset_node == node)]
        r_agg = self.repl_t[rp & (self.repl_gpu == g)]
        times = np.sort(np.r_[ticks, r_vol, r_agg, t_prev])
        mine = eps[ep_g == g]
        if len(mine):
            cum = ep.cumulative(mine, times, self.L)
            c = {name: v.sum(axis=0) for name, v in cum.items()}  # (K[, L])
        else:
            zs, zl = np.zeros(len(times), np.int64), np.zeros((len(times), self.L), np.int64)
            c = {n: zs for n in ("ce", "ue", "rr_c", "rr_u", "pcie")}
            c.update({n: zl for n in LINK_COUNTERS})
        for name, (bg, bt, bl) in benign.items():
            sel = bg == g
            if not sel.any():
                continue
            cnt = np.searchsorted(np.sort(bt[sel]), times, side="right")
            if name == "nv_flit":
                inc = np.zeros((len(times), self.L), dtype=np.int64)
                for tt, ll in zip(bt[sel].tolist(), bl[sel].tolist(), strict=True):
                    inc[times >= tt, ll] += 1
                c[name] = c[name] + inc
            else:
                c[name] = c[name] + cnt
        c["ce_v"] = c["ce_a"] = c.pop("ce")
        c["ue_v"] = c["ue_a"] = c.pop("ue")
        ti = np.searchsorted(times, ticks)
        i_prev = int(np.searchsorted(times, t_prev))
        for name in self.state:
            resets = r_vol if name in VOLATILE else r_agg
            cv = c[name]
            vals = cv[ti] + (self.state[name][g] - cv[i_prev])
            if len(resets):
                ridx = np.searchsorted(np.sort(resets), ticks, side="right") - 1
                has = ridx >= 0
                rvals = cv[ti] - cv[np.searchsorted(times, np.sort(resets))[np.maximum(ridx, 0)]]
                vals = np.where(has.reshape((-1,) + (1,) * (cv.ndim - 1)), rvals, vals)
            self.state[name][g] = vals[-1]
            self._moved[name].append(np.array([g]))
            out.put(name, np.array([g]), vals[None])
            if name in self.nonzero:
                self.nonzero[name][g] = self.state[name][g].any()

    def _advance_plain(self, gs: np.ndarray, ticks: np.ndarray, t_prev: float,
                       eps: np.ndarray, ep_g: np.ndarray, benign: dict,
                       out: _Rows, resets: tuple[np.ndarray, ...] | None = None) -> None:
        """``advance`` for GPUs ``gs`` (sorted, unique), all at once: the same integers the
        per-GPU path computes (per-episode floored curves summed per GPU, benign events
        counted at each time), on one time grid. ``resets``: (repair times, local nodes,
        replacement times, local GPUs) in the interval, for GPUs that see one: the grid
        then holds those times too, and a counter's value after its GPU's latest reset is
        what it gained since (a repair resets the volatile counters, a replacement the
        aggregate ones)."""
        S = len(gs)
        if not S:
            return
        times = np.sort(np.r_[ticks, t_prev] if resets is None
                        else np.r_[ticks, t_prev, resets[0], resets[2]])
        K, L = len(times), self.L
        row_of = np.full(self.G, -1, dtype=np.int64)
        row_of[gs] = np.arange(S)
        sel = row_of[ep_g] >= 0
        ep_rows = row_of[ep_g[sel]]
        # the per-link counters change only on GPUs with an episode or a benign NVLink
        # event, or with a reset when they are not zero: the others (most, when a long
        # interval catches up) keep theirs
        moves = np.zeros(S, dtype=bool)
        moves[ep_rows] = True
        r = row_of[benign["nv_flit"][0]]
        moves[r[r >= 0]] = True
        if resets is not None:
            for name in LINK_COUNTERS:
                moves |= self.nonzero[name][gs]
        link_rows = np.flatnonzero(moves)
        link_of = np.full(S, -1, dtype=np.int64)
        link_of[link_rows] = np.arange(len(link_rows))
        c = {n: np.zeros((S, K), np.int64) for n in ("ce", "ue", "rr_c", "rr_u", "pcie")}
        c.update({n: np.zeros((len(link_rows), K, L), np.int64) for n in LINK_COUNTERS})
        if sel.any():
            for name, v in self.ep.cumulative(eps[sel], times, L).items():
                _add_rows(c[name], link_of[ep_rows] if v.ndim == 3 else ep_rows, v)
        for name, (bg, bt, bl) in benign.items():
            r = row_of[bg]
            keep = r >= 0
            if not keep.any():
                continue
            j = np.searchsorted(times, bt[keep], side="left")  # first time >= the event
            if name == "nv_flit":
                inc = np.zeros((len(link_rows), K + 1, L), np.int64)
                _count_at(inc, (link_of[r[keep]], j, bl[keep]))
            else:
                inc = np.zeros((S, K + 1), np.int64)
                _count_at(inc, (r[keep], j))
            c[name] += _running_sum(inc)[:, :K]
        c["ce_v"] = c["ce_a"] = c.pop("ce")
        c["ue_v"] = c["ue_a"] = c.pop("ue")
        ti = np.searchsorted(times, ticks)
        i_prev = int(np.searchsorted(times, t_prev))
        since = {} if resets is None else self._last_resets(gs, row_of, times, ti, resets)
        for name, st in self.state.items():
            cv = c[name]
            rows = link_rows if cv.ndim == 3 else np.arange(S)
            if resets is None:
                # a GPU whose count does not move keeps its state, which its rows hold
                # already (a catch-up's many GPUs with a benign event move one or two
                # counters of eleven)
                moved = (cv[:, ti] != cv[:, i_prev, None]).any(axis=tuple(range(1, cv.ndim)))
                cv, rows = cv[moved], rows[moved]
                if not len(rows):
                    continue
            at = gs[rows]
            vals = cv[:, ti] + (st[at] - cv[:, i_prev])[:, None]  # (S, T[, L])
            last = since.get(_reset_kind(name))
            if last is not None:  # after a reset: the gain since it
                last = last[rows]
                after = cv[:, ti] - cv[np.arange(len(cv))[:, None], np.maximum(last, 0)]
                has = (last >= 0).reshape(last.shape + (1,) * (cv.ndim - 2))
                vals = np.where(has, after, vals)
            st[at] = vals[:, -1]
            self._moved[name].append(at)
            out.put(name, at, vals)
            if name in self.nonzero:
                self.nonzero[name][at] = vals[:, -1].any(axis=1)

    def _advance_tick(self, gs: np.ndarray, t_end: float, t_prev: float, eps: np.ndarray,
                      ep_g: np.ndarray, benign: dict,
                      resets: tuple[np.ndarray, ...] | None = None) -> None:
        """``_advance_plain`` of one tick ``t_end`` for GPUs ``gs`` (sorted, unique), the
        same integers without a time grid: each counter gains what its GPU's episodes'
        floored curves rose by and one per benign event since its start, ``t_prev`` or,
        with ``resets`` (as for ``_advance_plain``), the GPU's latest repair (volatile
        counters) or replacement (aggregate ones) in the interval, which zeroes it first.
        A catch-up over days moves ~40,000 GPUs of 100,000, and the (GPUs, times) arrays
        of the grid (with every repair's time in it) were most of its cost. The one
        tick's rows are then the state (``_Rows.finish``): nothing is put."""
        S = len(gs)
        if not S:
            return
        L = self.L
        row_of = np.full(self.G, -1, dtype=np.int64)
        row_of[gs] = np.arange(S)
        # each GPU's latest reset of each kind in the interval (-inf: none)
        reset: dict[str, np.ndarray | None] = {"vol": None, "agg": None}
        if resets is not None:
            r_t, r_node, p_t, p_gpu = resets
            node_last = np.full(self.N, -np.inf)  # each local node's latest repair
            np.maximum.at(node_last, r_node, r_t)
            reset["vol"] = node_last[self.nodes_of[gs]]
            reset["agg"] = agg = np.full(S, -np.inf)
            r = row_of[p_gpu]
            np.maximum.at(agg, r[r >= 0], p_t[r >= 0])
        since = {kind: None if x is None else np.where(x > -np.inf, x, t_prev)
                 for kind, x in reset.items()}  # (S,) each GPU's start; None: t_prev

        gains: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in self.state}
        mine = row_of[ep_g] >= 0
        if mine.any():
            at, rows = ep_g[mine], row_of[ep_g[mine]]
            start = {k: np.full(len(rows), t_prev) if x is None else x[rows]
                     for k, x in since.items()}
            times = np.unique(np.r_[t_prev, t_end, start["vol"], start["agg"]])  # t_end last
            first = {k: np.searchsorted(times, x) for k, x in start.items()}
            e = np.arange(len(rows))
            for name, v in self.ep.cumulative(eps[mine], times, L).items():  # (E, K[, L])
                for target in _INTO.get(name, (name,)):
                    rise = v[:, -1] - v[e, first[_reset_kind(target)]]
                    up = rise.any(axis=1) if rise.ndim == 2 else rise != 0
                    gains[target].append((at[up], rise[up]))
        for name, (bg, bt, bl) in benign.items():
            r = row_of[bg]
            hit = r >= 0
            for target in _INTO.get(name, (name,)):
                start_of = since[_reset_kind(target)]
                counted = hit.copy()
                if start_of is not None:  # (a reset zeroes what came before it)
                    counted[hit] = bt[hit] > start_of[r[hit]]
                if name == "nv_flit":
                    flat, n = np.unique(bg[counted] * L + bl[counted], return_counts=True)
                    g, link = np.divmod(flat, L)
                    rise = np.zeros((len(g), L), dtype=np.int64)
                    rise[np.arange(len(g)), link] = n
                else:
                    g, rise = np.unique(bg[counted], return_counts=True)
                gains[target].append((g, rise))
        zeroes = {}  # whether each GPU of ``gs`` was reset, by kind
        for k, last in reset.items():
            if last is not None:
                zeroes[k] = np.zeros(self.G, dtype=bool)
                zeroes[k][gs[last > -np.inf]] = True
        for name, st in self.state.items():
            parts = [(g, x) for g, x in gains[name] if len(g)]
            zeroed = zeroes.get(_reset_kind(name))
            if zeroed is not None:
                gz = gs[zeroed[gs]]
                parts.append((gz, np.zeros((len(gz), *st.shape[1:]), np.int64)))
            if not parts:
                continue
            at, which = np.unique(np.concatenate([g for g, _ in parts]), return_inverse=True)
            total = _sum_rows(which, np.concatenate([x for _, x in parts]), len(at))
            base = st.take(at, axis=0)
            if zeroed is not None:
                base[zeroed[at]] = 0
            vals = base + total
            st[at] = vals  # (the one tick's rows are the state: ``_Rows.finish``)
            self._moved[name].append(at)
            if name in self.nonzero:
                self.nonzero[name][at] = vals.any(axis=1)

    def _last_resets(self, gs: np.ndarray, row_of: np.ndarray, times: np.ndarray,
                     ti: np.ndarray, resets: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """For each GPU of ``gs`` and tick, the grid index of its latest repair ("vol")
        and replacement ("agg") at or before the tick, -1 if none (S, T)."""
        r_t, r_node, p_t, p_gpu = resets
        S, K = len(gs), len(times)
        marks = {}
        rows, which = np.nonzero(self.nodes_of[gs][:, None] == r_node[None, :])
        marks["vol"] = (rows, np.searchsorted(times, r_t[which]))
        rows = row_of[p_gpu]
        mine = rows >= 0
        marks["agg"] = (rows[mine], np.searchsorted(times, p_t[mine]))
        out = {}
        for kind, (r, k) in marks.items():
            at = np.full((S, K), -1, np.int64)
            at[r, k] = k
            out[kind] = np.maximum.accumulate(at, axis=1)[:, ti]
        return out


def _add_rows(a: np.ndarray, rows: np.ndarray, v: np.ndarray) -> None:
    """``np.add.at(a, rows, v)`` for rows >= 0: ``v``'s rows added to ``a``'s rows
    ``rows``, which may repeat. numpy's add.at costs ~1.5 µs a row here: from a few
    dozen rows on (a catch-up's), one fancy add of the rows, summed first where they
    repeat, is cheaper."""
    if len(rows) < 32:
        np.add.at(a, rows, v)
        return
    order = np.argsort(rows, kind="stable")
    r = rows[order]
    first = np.empty(len(r), dtype=bool)
    first[0] = True
    np.not_equal(r[1:], r[:-1], out=first[1:])
    if first.all():
        a[r] += v[order]
    else:
        at = np.flatnonzero(first)
        a[r[at]] += np.add.reduceat(v[order], at, axis=0)


def _reset_kind(name: str) -> str:
    """What resets counter ``name``: a repair ("vol") or a replacement ("agg")."""
    return "vol" if name in VOLATILE else "agg"


def _sum_rows(rows: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """The sum of ``v``'s rows (integers, (k[, L])) by ``rows`` (k,) in [0, n): (n[, L])
    int64. ``bincount`` adds in float64: exact for counts far below 2**53."""
    if v.ndim == 1:
        return np.bincount(rows, weights=v, minlength=n).astype(np.int64)
    L = v.shape[1]
    flat = (rows[:, None] * L + np.arange(L)).ravel()
    return np.bincount(flat, weights=v.ravel(), minlength=n * L).astype(np.int64).reshape(n, L)


def _count_at(a: np.ndarray, index: tuple[np.ndarray, ...]) -> None:
    """``np.add.at(a, index, 1)`` for indices >= 0: one count per index tuple; from a few
    dozen on (a catch-up's thousands), as counts of each distinct flat position."""
    if len(index[0]) < 64 or not a.flags.c_contiguous:  # (a reshaped copy would take them)
        np.add.at(a, index, 1)
        return
    where, n = np.unique(np.ravel_multi_index(index, a.shape), return_counts=True)
    a.reshape(-1)[where] += n


def _running_sum(inc: np.ndarray) -> np.ndarray:
    """``np.cumsum(inc, axis=1)``, in place. With few columns (a grid of a few times), one
    add per column over all rows: numpy's cumsum runs a loop as long as the axis once per
    row, which costs more than the adds."""
    if inc.shape[1] > 16:
        return np.cumsum(inc, axis=1)
    for k in range(1, inc.shape[1]):
        inc[:, k] += inc[:, k - 1]
    return inc


_EVERY_ROW = object()
"""The rows of an advance that keeps every row (``Counters._last``)."""


def kept_rows(keep: np.ndarray) -> tuple[RowTake, np.ndarray]:
    """For ``keep`` (T, G): each kept row's GPU (tick-major), as the ``RowTake`` of a
    GPU-indexed array's rows, and each (tick, GPU)'s kept row."""
    return _kept_gpus(keep), _kept_positions(keep)


def _kept_gpus(keep: np.ndarray) -> RowTake:
    """Each kept row's GPU (``kept_rows``'s first half)."""
    return RowTake(np.nonzero(keep)[1])


def _kept_positions(keep: np.ndarray) -> np.ndarray:
    """Each (tick, GPU)'s kept row (``kept_rows``'s second half)."""
    return (np.cumsum(keep.ravel()) - 1).reshape(keep.shape)


class _Rows:
    """The output rows of one advance, kept where ``keep`` says (tick-major). For one
    tick: the state after the advance, taken by ``finish``. For more ticks: each GPU's
    prior state repeated per tick, with ``put`` overwriting some GPUs' rows.
    ``nonzero``: for the per-link counters, the only GPUs whose prior state is not zero;
    those counters are given as ``SparseLinks`` by ``finish``: for one tick, from the
    state after the advance of the GPUs ``Counters.nonzero`` then holds; for more, from
    the non-zero GPUs' prior state and what ``put`` gave."""

    def __init__(self, state: dict[str, np.ndarray], T: int, keep: np.ndarray | None,
                 nonzero: dict[str, np.ndarray] | None = None,
                 kept: tuple[RowTake, np.ndarray] | None = None) -> None:
        """``kept``: ``kept_rows(keep)`` when known."""
        self.T, self.keep = T, keep
        self.G = len(next(iter(state.values())))
        # each kept row's GPU, and the kept row of each (tick, GPU): ``_g_of``, ``_pos``
        self.g_of: RowTake | None = None if kept is None else kept[0]
        self.pos: np.ndarray | None = None if kept is None else kept[1]
        self.cols: dict[str, np.ndarray] = {}
        # per-link counters: (GPUs, their values (S, T, L)) in the order given, the
        # prior state of the non-zero GPUs first
        self.links: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.n = T * self.G if keep is None else int(np.count_nonzero(keep))
        self.state = state
        for name, nz in (nonzero or {}).items():
            st = state[name]
            # one tick: its values are the state after the advance (``finish``)
            self.links[name] = [] if T == 1 else [
                (nz, np.broadcast_to(st[nz][:, None], (len(nz), T, *st.shape[1:])))]
        if T == 1:  # its values are the state after the advance (``finish``)
            return
        for name, st in state.items():
            if name in self.links:
                continue
            if keep is None:
                col = np.empty((self.n, *st.shape[1:]), dtype=st.dtype)
                col.reshape(T, *st.shape)[...] = st
                self.cols[name] = col
            else:
                self.cols[name] = self._g_of()(st)

    def _g_of(self) -> RowTake:
        """Each kept row's GPU (``keep`` is not None), made when first needed."""
        assert self.keep is not None
        if self.g_of is None:
            self.g_of = _kept_gpus(self.keep)
        return self.g_of

    def _pos(self) -> np.ndarray:
        """The kept row of each (tick, GPU) (``keep`` is not None), made when first needed."""
        assert self.keep is not None
        if self.pos is None:
            self.pos = _kept_positions(self.keep)
        return self.pos

    def put(self, name: str, gs: np.ndarray, vals: np.ndarray) -> None:
        """Rows of GPUs ``gs`` (S,) at every tick: ``vals`` (S, T[, L]). A GPU is put at
        most once per counter."""
        if self.T == 1:  # (the state holds it: ``finish``)
            return
        if name in self.links:
            self.links[name].append((gs, vals))
            return
        v = np.swapaxes(vals, 0, 1)  # (T, S[, L])
        if self.keep is None:
            rows = np.arange(self.T)[:, None] * self.G + gs[None, :]
            self.cols[name][rows.ravel()] = v.reshape(-1, *v.shape[2:])
            return
        m = self.keep[:, gs]
        self.cols[name][self._pos()[:, gs][m]] = v[m]

    def finish(self, nonzero: dict[str, np.ndarray], last: dict[str, np.ndarray] | None = None,
               moved: dict[str, list[np.ndarray]] | None = None) -> dict[str, Column]:
        """Every counter's rows, the per-link counters as ``SparseLinks`` (their non-zero
        rows); ``nonzero``: whether each GPU's state is not zero after the advance. For one
        tick, ``last``: the previous one-tick columns of the same rows (read-only), and
        ``moved``: the GPUs whose state was written since; a column then is the last one
        when none of its GPUs moved (shared, read-only), else a copy with their rows
        written: a copy costs a third of taking the kept rows, and few GPUs move a tick."""
        if self.T == 1:
            return {name: self._sparse_now(name, np.flatnonzero(nonzero[name]))
                    if name in self.links else self._now(name, last, moved)
                    for name in self.state}
        cols: dict[str, Column] = dict(self.cols)
        for name, parts in self.links.items():
            cols[name] = self._sparse(parts)
        return cols

    def _kept_now(self, gs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of the GPUs ``gs``, those whose row is kept at the one tick, and their rows."""
        if self.keep is None:
            return gs, gs
        gs = gs[self.keep[0, gs]]
        return gs, self._pos()[0, gs]

    def _now(self, name: str, last: dict[str, np.ndarray] | None = None,
             moved: dict[str, list[np.ndarray]] | None = None) -> np.ndarray:
        """One tick's column, read-only: the state at the kept rows (see ``finish``)."""
        st = self.state[name]
        if last is not None and moved is not None:
            if not moved[name]:
                return last[name]
            col = last[name].copy()
            gs, rows = self._kept_now(np.concatenate(moved[name]))
            col[rows] = st.take(gs)
        elif self.keep is None:
            col = st.copy()
        else:
            col = self._g_of()(st)
        col.flags.writeable = False
        return col

    def _sparse_now(self, name: str, gs: np.ndarray) -> SparseLinks:
        """One tick's rows of the GPUs ``gs`` whose state is not zero: that state."""
        st = self.state[name]  # (``take``: a fancy index of rows costs three times as much)
        gs, rows = self._kept_now(gs)
        return SparseLinks(self.n, st.shape[1], rows, st.take(gs, axis=0))

    def _sparse(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> SparseLinks:
        (prior, prior_v), puts = parts[0], parts[1:]
        L = prior_v.shape[2]
        if puts:  # a GPU put replaces its prior state
            put = np.concatenate([g for g, _ in puts])
            stays = ~np.isin(prior, put)
            gs = np.concatenate([prior[stays], put])
            vs = np.concatenate([prior_v[stays], *(v for _, v in puts)]).astype(LINK_DTYPE)
            order = np.argsort(gs, kind="stable")
            gs, vs = gs[order], vs[order]
        else:
            gs, vs = prior, prior_v
        v = np.swapaxes(vs, 0, 1)  # (T, S, L), GPUs in order
        if self.keep is None:
            rows = (np.arange(self.T)[:, None] * self.G + gs[None, :]).ravel()
            values = v.reshape(-1, L)
        else:
            m = self.keep[:, gs]
            rows, values = self._pos()[:, gs][m], v[m]
        some = values.any(axis=1)
        if not some.all():
            rows, values = rows[some], values[some]
        return SparseLinks(self.n, L, rows, np.ascontiguousarray(values, dtype=LINK_DTYPE))
