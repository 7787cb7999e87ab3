"""Every README example, as a new user runs it: in order, from a shell, as written.

    .venv/bin/python benchmarks/readme_examples.py [--dir DIR] [--venv PATH] [--all] [--out FILE.md]

Clones this repository's HEAD into DIR (default: a new temporary folder), runs the README's
two set-up commands' install (`make setup`; `--venv PATH` links an installed environment
instead, to skip the download), then each line of the README's ```bash blocks in one bash
session after `source .venv/bin/activate`, in order and at full size (the clone's code:
PYTHONPATH is the clone, whatever the linked environment was installed from). The README's input
files (train.txt, day_0.gz, clicks.parquet, ...) are stood in for by the repository's real
samples, as `tests/test_readme_examples.py` does. Prints, per line, its exit status, wall
time and every warning it printed; exits 1 if a line failed.

Skipped unless --all: the lines that need another machine or hours (SKIP below).
`tests/test_readme_examples.py` runs the same lines in the test suite, smaller and in process.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_readme_examples import _stand_ins, readme_commands  # noqa: E402

SKIP = {
    "make test": "the test suite (run on its own)",
    "bagpipe train data/demo --system bagpipe --trainers 8 --servers 3 --procs 6 --master "
    "10.0.0.1:29500 --node-rank 0 --out results/dist": "needs a second machine",
    "bagpipe bench benchmarks/paper.yaml --repeat 3 --out results/paper": "hours of runs",
    "bagpipe bench --resume --out results/paper": "continues the hours of runs above",
}


def _clicks(here: Path) -> None:
    """clicks.parquet, the README's own-file example: label clicked, user/item ids, a price."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 5000
    pd.DataFrame({"clicked": rng.integers(0, 2, n), "user": [f"u{x}" for x in rng.zipf(1.3, n) % 500],
                  "item": [f"i{x}" for x in rng.zipf(1.2, n) % 300],
                  "price": rng.gamma(2.0, 10.0, n).round(2)}).to_parquet(here / "clicks.parquet")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, help="where to clone (must not exist) [a temporary folder]")
    ap.add_argument("--venv", type=Path, help="an installed environment to link as .venv")
    ap.add_argument("--all", action="store_true", help="run the skipped lines too")
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    a = ap.parse_args()
    here = a.dir or Path(tempfile.mkdtemp(prefix="bagpipe-readme-")) / "bagpipe-cli"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(here)], check=True)
    if a.venv:
        (here / ".venv").symlink_to(a.venv.resolve())
        (a.venv / ".installed").touch()  # make's stamp: the environment is installed
    _stand_ins(here)
    _clicks(here)
    rows = []
    for line in readme_commands():
        if line == "source .venv/bin/activate":
            continue  # every line below runs after it
        if line in SKIP and not a.all:
            rows.append((line, "skipped", "", SKIP[line]))
            print(f"skipped  {line}  ({SKIP[line]})", flush=True)
            continue
        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", f"source .venv/bin/activate && {line}"], cwd=here,
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "200",
                                                                "PYTHONPATH": str(here)})
        took = time.monotonic() - t0
        said = re.findall(r"^(?:Warning|Error): .*", r.stdout + r.stderr, re.M)
        rows.append((line, r.returncode, f"{took:.0f} s", "; ".join(said)))
        print(f"rc {r.returncode}  {took:6.1f} s  {line}", flush=True)
        for s in said:
            print(f"    {s}", flush=True)
    table = ["| README line | exit | wall | what it said |", "|---|---:|---:|---|"]
    table += [f"| `{x}` | {rc} | {t} | {s} |" for x, rc, t, s in rows]
    if a.out:
        a.out.write_text("\n".join(table) + "\n")
    print("\n".join(table))
    print(f"clone: {here}")
    return 1 if any(rc not in (0, "skipped") for _, rc, _, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
