"""Bytes a process sent and received, by kind: what `summary.json` reports per role
(`roles.<role>.traffic`), counted alike by both runtimes.

    plan        a round's plan (rank 0, and the trainers that relay it down the tree)
    samples     batches' samples (none cross the network: every trainer reads its own)
    rows        embedding rows: fetches (their requests' keys and the rows served) and
                write-backs (rows with their optimizer state)
    gradients   row gradients pushed to the servers (sync, het)
    collective  the trainers' sums (dense gradients, synchronised rows, losses)
    control     start-up state, checkpoints, evaluations, results and the requests' headers

A request to a server is counted as it crosses (`request_bytes`: its header, its keys, its
payload), by the trainer that sends it and the server that serves it; the rows a fetch
brings back are the server's sent and the trainer's received. Over torch.distributed these
are the messages themselves (`engine/distributed/transport.py` and
`engine/distributed/server.py`); in-process (`engine/local/transport.py`) the same requests
are counted as the distributed runtime would send them, every trainer's (`Transport`'s
`asked`): every server gets every request, empty or not, as in lockstep, so an in-process
run's trainers' process counts what its N trainer ranks together would. A plan is counted as the planner encodes it
(`engine/distributed/rounds.py`'s `PlanWire`), in both runtimes; a process's sums by its
collective (`comm.collective.count_collective`). In-process nothing else crosses a process
boundary (start-up state, checkpoints, evaluations, results), so its `control` stays 0.
"""

from __future__ import annotations

from typing import Any

KINDS = ("plan", "samples", "rows", "gradients", "collective", "control")
HEADER = 5  # int64s of a request's header: op, rows, sequence number, iteration, round


def request_bytes(rows: int, payload: int = 0) -> int:
    """A request to a server as it crosses: its header, then (with rows) their int64 local
    indices and its `payload` bytes (rows and state of a write-back, a push's gradients)."""
    return 8 * HEADER + (8 * rows + payload if rows else 0)


class Traffic:
    """Bytes sent and received by kind (see the module docstring)."""

    def __init__(self) -> None:
        self.sent = dict.fromkeys(KINDS, 0)
        self.received = dict.fromkeys(KINDS, 0)

    def send(self, kind: str, nbytes: int) -> None:
        self.sent[kind] += int(nbytes)

    def receive(self, kind: str, nbytes: int) -> None:
        self.received[kind] += int(nbytes)

    def figures(self, iterations: int) -> dict[str, Any]:
        """The totals by kind, and the same per iteration of the run."""
        per = max(1, iterations)
        return {"sent": dict(self.sent), "received": dict(self.received),
                "sent_per_iteration": {k: v / per for k, v in self.sent.items()},
                "received_per_iteration": {k: v / per for k, v in self.received.items()},
                "iterations": int(iterations)}
