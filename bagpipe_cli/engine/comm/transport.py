"""The seam between a trainer process and the embedding servers: the `Transport` interface.

The interface is made for a deterministic schedule: the oracle's plan says who sends what
to whom and when, so a transport needs no any-source receives. Requests to one server are
served in the order they are made (FIFO): that is what makes a round's write-backs land
before later fetches of the same rows.

Runtimes: `engine/local/transport.py` (serving threads in this process) and
`engine/distributed/transport.py` (server ranks over torch.distributed).

`asked`: a process that runs several trainers (in-process) makes one request for all of
them; `asked` names what each trainer would ask for (the requests its rank would send), so
the transport counts and charges those requests (`engine/comm/traffic.py`) while it moves
the rows once. None: the call is this process's one request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import torch

from bagpipe_cli.engine.comm.network import NetworkModel

Asked = list[np.ndarray] | None  # per trainer, the keys its request holds (module docstring)


class RowsFuture(Protocol):
    """A fetch in flight: `result()` waits for it and returns (rows, optimizer state)."""

    def done(self) -> bool: ...

    def result(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class Transport(ABC):
    """A trainer process's view of the embedding servers."""

    network: NetworkModel
    num_servers: int
    lockstep = False  # every trainer must send every server the same sequence of requests
    bytes_sent = 0  # payload bytes this trainer process sent to the servers
    bytes_received = 0  # and received from them

    @abstractmethod
    def fetch(self, keys: np.ndarray, asked: Asked = None) -> RowsFuture:
        """Start fetching the rows (and optimizer state) of global `keys`, in that order."""

    @abstractmethod
    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor,
                   asked: Asked = None) -> list[Future]:
        """Start writing rows back to their servers; the futures complete when they landed."""

    @abstractmethod
    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any,
                       asked: Asked = None) -> list[Future]:
        """Send row gradients to the servers, which apply the row optimizer `opt`."""

    @abstractmethod
    def close(self) -> None:
        """Finish outstanding requests and stop workers."""

    def drain(self) -> None:  # noqa: B027 (nothing to wait for unless a transport sends asynchronously)
        """Wait until every request sent so far has left this process, so that the tensors
        it sent are not kept alive."""
