"""bagpipe-cli: benchmark and profile Bagpipe-style lookahead embedding caching."""

import os
import sys

__version__ = "0.1.0"

# torch's intra-op threads (OpenMP) spin for a while after each parallel region by default.
# On a machine that is busy, or when the run's own helper threads (loader, servers,
# collectives) share the cores, a spinning thread holds a core that the thread it waits for
# needs: a user's bench on a loaded 2-core machine ran bagpipe, local and prefetch 10-50x
# slower than at --threads 1 (benchmarks/bench_threads.py). Waiting threads sleep instead,
# unless the user chose otherwise. OpenMP reads this when torch loads, so it is set here,
# before anything imports torch; `environment.json` records whether it took effect.
OMP_WAIT_POLICY = os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
OMP_WAIT_POLICY_APPLIED = "torch" not in sys.modules
