"""Bytes a process sent and received, by kind: what `summary.json` reports per role.

    plan        a round's plan (rank 0, and the trainers that relay it down the tree)
    samples     batches' samples (none cross the network: every trainer reads its own)
    rows        embedding rows: fetches (their requests' keys and the rows served) and
                write-backs (rows with their optimizer state)
    gradients   row gradients pushed to the servers (sync, het)
    collective  the trainers' sums (dense gradients, synchronised rows, losses)
    control     start-up state, checkpoints, evaluations, results and the requests' headers
"""

from __future__ import annotations

from typing import Any

KINDS = ("plan", "samples", "rows", "gradients", "collective", "control")


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
