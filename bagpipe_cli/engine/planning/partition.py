"""The physical partition of Bagpipe's cache (LRPP): who holds, sums and sends each row.

The cache is one logical cache (the oracle's), held in pieces: a row of U_b is on the
trainers whose samples read it at b (its *writers*, W_b) and, between its uses, on one
trainer alone, its *home*, which holds its value and optimizer state. Per iteration b and
row x of U_b (`Partition`):

- `src[x]`: where x's value is before b: its home since its last use, or -1 where x was
  fetched for b (the servers send it to each writer of b, `fetched_by`);
- deliver: before b reads, the home sends x (row and state) to every writer that is not
  the home (`deliveries`);
- reduce: after the backward, every writer but `home[x]` sends its partial gradient of x to
  `home[x]`, one of the writers of b, which sums them in trainer order (the additions of
  `ordered_sum`, so the values stay sync's bits) and applies the row optimizer (`partials`);
  `sync_now` rows on the critical path, `sync_later` ones in the background, settled before
  b+2 as before; a `no_sync` row's one writer is its home and sends nothing;
- home[x] is kept until x's next use; if x is evicted after b, the home writes it back.

The home of b is a writer of b that reads x at b+1 too where there is one (it then sends
x to one trainer fewer), else any writer; among them the (x mod count)-th, so the rows
every trainer reads (the hot head) spread over the trainers as a sum's chunks do, and a
row read by the same trainers keeps its home.

Over torch.distributed each trainer receives the Partition's entries of the rows it reads or
is home of (`engine/distributed/rounds.py`), so each knows what it sends, to whom, and what
it receives from whom, in one order: by position in U_b.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SYNC_NOW, SYNC_LATER, NO_SYNC = 0, 1, 2  # a row's LRPP class at b (engine/planning/oracle.py)


def pairs_of(inverse: np.ndarray, rows: int, trainers: np.ndarray, n: int) -> np.ndarray:
    """The distinct (row, writer) pairs of a batch as sorted codes row * n + trainer
    (`inverse`: each access's position in U_b, `trainers`: each access's trainer). A fresh
    table each batch: its pages are zeroed as they are touched, which costs less than
    clearing a kept one."""
    mark = np.zeros(rows * n, dtype=bool)
    mark[inverse.astype(np.int64) * n + trainers] = True
    return np.flatnonzero(mark)


@dataclass
class Partition:
    """One iteration's partition of U_b (see the module docstring); every array is by
    position in U_b, except `writers`, by (row, writer) pair in row then trainer order."""

    count: np.ndarray  # [|U_b|] writers of each row
    writers: np.ndarray  # [pairs] the writers of each row, in trainer order
    home: np.ndarray  # [|U_b|] the row's home after b (one of its writers)
    src: np.ndarray  # [|U_b|] its home before b, -1: fetched for b from the servers
    _row: np.ndarray | None = field(default=None, repr=False)
    _first: np.ndarray | None = field(default=None, repr=False)
    _flows: Flows | None = field(default=None, repr=False)

    @property
    def pair_row(self) -> np.ndarray:
        """[pairs] the position in U_b of each pair's row."""
        if self._row is None:
            self._row = np.repeat(np.arange(len(self.count)), self.count.astype(np.int64))
        return self._row

    @property
    def first(self) -> np.ndarray:
        """[|U_b|] the index of each row's first pair (its writers start there)."""
        if self._first is None:
            c = self.count.astype(np.int64)
            self._first = np.cumsum(c) - c
        return self._first

    def moves(self, row_class: np.ndarray, n: int) -> Flows:
        """What it moves per trainer (`flows`), computed once."""
        if self._flows is None:
            self._flows = flows(self, row_class, n)
        return self._flows

    def __getstate__(self) -> dict:
        """On the wire, the four arrays: what is derived from them is derived again."""
        return {**self.__dict__, "_row": None, "_first": None, "_flows": None}

    def rows_of(self, i: int) -> np.ndarray:
        """Positions in U_b of the rows trainer i reads at b (sorted)."""
        return self.pair_row[self.writers == i]


def partition(uniq: np.ndarray, codes: np.ndarray, n: int, fetched: np.ndarray,
              home_of: np.ndarray, nxt: tuple[np.ndarray, np.ndarray, int] | None) -> Partition:
    """Batch b's Partition from its pairs (`codes`, `pairs_of`), which rows were fetched for
    it, the homes so far (`home_of`, by global key: updated to b's homes) and, if batch b+1
    is known, (each row's position in U_{b+1} or -1, b+1's pairs, |U_{b+1}|)."""
    rows, tr = np.divmod(codes, n)
    tr = tr.astype(np.int16)
    count = np.bincount(rows, minlength=len(uniq))
    key = uniq.astype(np.int64)
    cand = np.zeros(len(codes), dtype=bool)  # pairs whose writer reads the row at b+1 too
    if nxt is not None:
        next_pos, codes1, rows1 = nxt
        at = next_pos[rows]
        in1 = np.flatnonzero(at >= 0)
        pair1 = np.zeros(rows1 * n, dtype=bool)  # b+1's pairs, by code
        pair1[codes1] = True
        cand[in1] = pair1[at[in1].astype(np.int64) * n + tr[in1]]
    ccount = np.bincount(rows[cand], minlength=len(uniq))
    first = np.cumsum(count) - count
    pick = first + key % np.maximum(count, 1)  # among every writer ...
    has = ccount > 0  # ... or among those reading it at b+1
    pick[has] = np.flatnonzero(cand)[(np.cumsum(ccount) - ccount)[has] + key[has] % ccount[has]]
    home = tr[pick]
    src = np.where(fetched, -1, home_of[uniq]).astype(np.int16)
    home_of[uniq] = home
    return Partition(count.astype(np.int16), tr, home, src, _row=rows, _first=first)


@dataclass
class Flows:
    """Rows one iteration moves per trainer (arrays [N]): fetched from the servers,
    delivered (sent by homes, received by writers), and partial gradients sent to homes and
    received by them, on the critical path (`now`) and in the background (`later`)."""

    fetched: np.ndarray
    delivered_sent: np.ndarray
    delivered_received: np.ndarray
    now_sent: np.ndarray
    now_received: np.ndarray
    later_sent: np.ndarray
    later_received: np.ndarray


def flows(p: Partition, row_class: np.ndarray, n: int) -> Flows:
    """What iteration b's Partition moves, per trainer (what a trainer rank sends)."""
    row, w = p.pair_row, p.writers.astype(np.int64)
    src, home = p.src[row].astype(np.int64), p.home[row].astype(np.int64)
    fetched = src < 0
    move = ~fetched & (w != src)
    away = w != home
    cls = row_class[row]

    def count(who: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.bincount(who[mask], minlength=n)

    return Flows(count(w, fetched), count(src, move), count(w, move),
                 count(w, away & (cls == SYNC_NOW)), count(home, away & (cls == SYNC_NOW)),
                 count(w, away & (cls == SYNC_LATER)), count(home, away & (cls == SYNC_LATER)))


