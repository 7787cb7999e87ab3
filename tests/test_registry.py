"""Every list of systems that should hold every system (or every system of a kind) holds it.

Code and tests enumerate the registry (`ENGINE_SYSTEMS`, `SYSTEMS` filtered by a spec's
attributes). A bench file, a cluster file or a table of the docs cannot: `LISTINGS` names
each such list and which systems it must name, and `test_every_list_names_every_system`
fails naming the file and the system it lacks. A file that names systems on purpose only
for some is in `SUBSETS`, with the reason; a new file that names several systems must be in
one or the other. Lists in code (tests, benchmarks) of three or more system names are in
`CODE_SUBSETS`, with the reason; any other is to be the registry's.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from bagpipe_cli.engine import registry
from bagpipe_cli.engine.registry import Lazy, SystemSpec

ROOT = Path(__file__).resolve().parents[1]
Systems = dict[str, SystemSpec]


def _engine(systems: Systems) -> list[set[str]]:
    return [{n} for n, s in systems.items() if not s.external]


def _simulated(systems: Systems) -> list[set[str]]:
    """The systems `bagpipe simulate` has a performance model of (their volumes)."""
    return [{n} for n, s in systems.items() if not s.external and s.volumes]


def _every(systems: Systems) -> list[set[str]]:
    return [{n} for n in systems]


def _peak_capacity(systems: Systems) -> list[set[str]]:
    return [{n} for n, s in systems.items() if s.capacity_from_peak]


def _cached(systems: Systems) -> list[set[str]]:
    """The systems `engine/systems/cached.py` builds (`CacheSystem`)."""
    return [{n} for n, s in systems.items()
            if isinstance(s.build_system, Lazy) and s.build_system.target.endswith(":CacheSystem.build")]


def _replicated(systems: Systems) -> list[set[str]]:
    return [{n} for n, s in systems.items() if s.replicated and not s.external]


def _pushing(systems: Systems) -> list[set[str]]:
    return [{n} for n, s in systems.items() if not s.replicated and not s.external]


def _planned_by(builder: str) -> Callable[[Systems], list[set[str]]]:
    """The engine systems whose plan is `engine/planner.py`'s `builder`."""
    return lambda systems: [{n} for n, s in systems.items() if not s.external
                            and isinstance(s.plan, Lazy) and s.plan.target.endswith(f":{builder}")]


def _per_volumes(systems: Systems) -> list[set[str]]:
    """One system of each simulated traffic model (any one of those sharing it; systems
    `simulate` has no model of are not simulated)."""
    groups: dict[str | None, set[str]] = {}
    for n, s in systems.items():
        if not s.external and s.volumes:
            groups.setdefault(s.volumes, set()).add(n)
    return list(groups.values())


def _words(text: str, systems: Systems) -> set[str]:
    """The registered systems `text` names as words."""
    return {n for n in systems if re.search(rf"(?<![\w/.-]){re.escape(n)}(?![\w/-])", text)}


def _block(lines: list[str], anchor: str) -> list[str]:
    """The lines from the one holding `anchor` up to the next blank line."""
    start = next((i for i, ln in enumerate(lines) if anchor in ln), None)
    assert start is not None, f"{anchor!r} is not there any more: update LISTINGS"
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def table(anchor: str) -> Callable[[str, Systems], set[str]]:
    """The systems named in the first column of the Markdown table whose header holds `anchor`."""
    def names(text: str, systems: Systems) -> set[str]:
        rows = [ln.split("|")[1] for ln in _block(text.splitlines(), anchor)[2:]]
        return _words(" ".join(rows), systems)
    return names


def line(anchor: str, upto: bool = False) -> Callable[[str, Systems], set[str]]:
    """The systems named on the line (or table row) that holds `anchor`; with `upto`, before it."""
    def names(text: str, systems: Systems) -> set[str]:
        ln = _block(text.splitlines(), anchor)[0]
        return _words(ln.split(anchor)[0] if upto else ln, systems)
    return names


def bold_items(heading: str) -> Callable[[str, Systems], set[str]]:
    """The systems named in bold (`- **lru, lfu, fae**: ...`) in the section `heading`."""
    def names(text: str, systems: Systems) -> set[str]:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        return _words(" ".join(re.findall(r"\*\*(.+?)\*\*", section)), systems)
    return names


def _yaml_systems(raw: dict, systems: Systems) -> set[str]:
    return {e["name"] if isinstance(e, dict) else e for e in raw["systems"]} & set(systems)


def yaml_file(text: str, systems: Systems) -> set[str]:
    """The `systems` of a bench or cluster file."""
    return _yaml_systems(yaml.safe_load(text), systems)


def yaml_example(anchor: str) -> Callable[[str, Systems], set[str]]:
    """The `systems` of the YAML code block that follows `anchor` in a Markdown page."""
    def names(text: str, systems: Systems) -> set[str]:
        after = text.split(anchor, 1)[1]
        return _yaml_systems(yaml.safe_load(after.split("```yaml\n", 1)[1].split("```", 1)[0]), systems)
    return names


@dataclass(frozen=True)
class Listing:
    path: str
    what: str  # the list, in words (the failure names it)
    names: Callable[[str, Systems], set[str]]  # the systems it names, from the file's text
    wants: Callable[[Systems], list[set[str]]]  # what it must name: one of each set


LISTINGS = (
    Listing("README.md", "the systems table", table("| system | what it models |"), _every),
    Listing("README.md", "the systems whose default --cache-rows is Bagpipe's peak",
            line("the default `--cache-rows` is Bagpipe's peak", upto=True), _peak_capacity),
    Listing("README.md", "the quick bench file shown", yaml_example("A YAML or TOML matrix"), _engine),
    Listing("docs/architecture.md", "How the systems map onto trainers and servers",
            bold_items("## How the systems map onto trainers and servers"), _engine),
    Listing("docs/architecture.md", "the systems CacheSystem runs (engine/systems/cached.py)",
            line("| `engine/systems/cached.py` |"), _cached),
    Listing("docs/performance-model.md", "the table of what each system exposes",
            table("| system | what is exposed |"), _simulated),
    Listing("docs/performance-model.md", "the table of a round's plan bytes",
            table("| system | bytes of a round's plan |"), _simulated),
    *(Listing(f"benchmarks/{name}.yaml", "systems (every system of the engine)", yaml_file, _engine)
      for name in ("quick", "paper", "criteo-kaggle", "distributed")),
    Listing("benchmarks/paper-scenario.yaml", "systems (every system simulate models)", yaml_file,
            _simulated),
    Listing("benchmarks/distributed-validate.yaml", "systems (one of each traffic model)",
            yaml_file, _per_volumes),
)

# Files that name systems but list only some, on purpose.
SUBSETS = {
    "benchmarks/het-tradeoff.yaml": "het's staleness against sync and bagpipe",
    "benchmarks/successors.yaml": "bagpipe against the systems after it (hotline, slipstream, "
                                  "prefetch) and the two they build on (fae, sync)",
    "benchmarks/hotline-model.yaml": "hotline's performance model: hotline beside fae (its "
                                     "transfers) and sync",
    "benchmarks/rank0-sweep.yaml": "rank 0 at scale: one system per kind of plan (|U_b|, lookahead, policy)",
    "benchmarks/torchrec.yaml": "the external torchrec beside the engine's sync, local and bagpipe",
    "docs/benchmarks.md": "measured figures, each of the systems run at the commit it names",
    "docs/terabyte.md": "the Terabyte-scale profile's measured stages",
}


def missing_from_lists(systems: Systems) -> list[str]:
    """'file: list lacks system' for every list in LISTINGS that lacks one of its systems."""
    out = []
    for ls in LISTINGS:
        named = ls.names((ROOT / ls.path).read_text(), systems)
        for group in ls.wants(systems):
            if not group & named:
                out.append(f"{ls.path}: {ls.what} lacks {' or '.join(sorted(group))}")
    return out


def test_every_list_names_every_system():
    assert not missing_from_lists(registry.SYSTEMS), (
        "add the system to each, or move the file to SUBSETS with the reason")


def test_a_new_system_is_missing_from_every_list(monkeypatch):
    """A system registered and listed nowhere: each list that must hold it says it lacks it."""
    fake = replace(registry.SYSTEMS["lru"], name="fakecache", volumes="tests:fake_volumes")
    systems = {**registry.SYSTEMS, "fakecache": fake}
    monkeypatch.setattr(registry, "SYSTEMS", systems)
    monkeypatch.setattr(registry, "ENGINE_SYSTEMS", (*registry.ENGINE_SYSTEMS, "fakecache"))
    found = missing_from_lists(registry.SYSTEMS)
    # An lru with traffic of its own: every list.
    wanted = list(LISTINGS)
    assert len(found) == len(wanted), found
    for ls in wanted:
        assert f"{ls.path}: {ls.what} lacks fakecache" in found


def test_a_system_of_a_kind_already_listed_is_missing_only_where_all_are_named():
    fake = replace(registry.SYSTEMS["local"], name="fakelocal")
    found = missing_from_lists({**registry.SYSTEMS, "fakelocal": fake})
    assert "benchmarks/distributed-validate.yaml: systems (one of each traffic model) lacks fakelocal" \
        not in found  # local stands for its traffic model
    assert "benchmarks/quick.yaml: systems (every system of the engine) lacks fakelocal" in found
    assert not any("Bagpipe's peak" in f or "CacheSystem" in f for f in found)  # not of that kind


def _named_files() -> list[str]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.yaml")]
    engine = {n: s for n, s in registry.SYSTEMS.items() if not s.external}
    return sorted(str(p.relative_to(ROOT)) for p in files if len(_words(p.read_text(), engine)) >= 3)


def test_every_file_that_names_systems_is_checked_or_a_known_subset():
    listed = {ls.path for ls in LISTINGS}
    unknown = [f for f in _named_files() if f not in listed and f not in SUBSETS]
    assert not unknown, f"{unknown}: add their lists of systems to LISTINGS or the file to SUBSETS"
    assert all((ROOT / f).exists() for f in SUBSETS)


# Lists of three or more system names in code, on purpose; the rest enumerate the registry.
CODE_SUBSETS = {
    ("tests/test_baselines.py", frozenset({"bagpipe", "lru", "lfu", "fae", "het", "local"})):
        "a floor: the registry's filter still enrols the systems known exact",
    ("tests/test_simulate.py", frozenset({"sync", "bagpipe", "het", "hotline"})):
        "the measured in-process runs of the `runs` fixture",
    ("tests/test_simulate.py", frozenset({"sync", "bagpipe", "het"})):
        "the progress bar's traces: one without a cache, one planned, one retraced per trainer count",
    ("tests/test_simulate.py", frozenset({"sync", "bagpipe", "lru", "local"})):
        "a cluster file's systems, and the predictions made of it",
    ("tests/test_simulate_calibrate.py", frozenset({"bagpipe", "het", "local", "sync"})):
        "the fabricated runs' one-pass systems, which share one compute figure",
    ("tests/test_simulate_calibrate.py", frozenset({"het", "hotline", "local", "sync"})):
        "the systems of the fabricated runs that bagpipe's table compares with",
    ("tests/test_checkpoint.py", frozenset({"bagpipe", "lru", "hotline", "local"})):
        "resumed over torch.distributed: a partitioned cache, victims written back, a split "
        "batch, whole tables",
    ("benchmarks/bench_feed.py", frozenset({"local", "sync", "bagpipe"})):
        "the default --systems timed: one without a view of U_b, two with",
    ("benchmarks/bench_gpu.py", frozenset({"local", "sync", "bagpipe"})):
        "the engine on a GPU: the bound, the reference and ours",
    ("benchmarks/bench_placement.py", frozenset({"sync", "bagpipe", "local"})):
        "the placement's effect on the reference, ours and the bound",
    ("benchmarks/bench_torchrec.py", frozenset({"torchrec", "local", "sync", "bagpipe"})):
        "torchrec against the engine's bound, reference and ours",
    ("benchmarks/sweep_collectives.py", frozenset({"sync", "bagpipe", "lru"})):
        "the collectives' cost on one system per kind of sum",
}


def _code_lists() -> list[tuple[str, frozenset[str], int]]:
    names = set(registry.ALL_SYSTEMS)
    out = []
    files = [*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "bagpipe_cli").rglob("*.py")]
    for p in sorted(files):
        rel = str(p.relative_to(ROOT))
        if rel in ("bagpipe_cli/engine/registry.py", "tests/test_registry.py"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                firsts = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in node.elts]
                found = frozenset(e.value for e in firsts  # names, or (name, ...) pairs
                                  if isinstance(e, ast.Constant) and e.value in names)
                if len(found) >= 3:
                    out.append((rel, found, node.lineno))
    return out


def test_code_enumerates_the_registry():
    lists = _code_lists()
    hand = [f"{f}:{line}: {sorted(found)}" for f, found, line in lists if (f, found) not in CODE_SUBSETS]
    assert not hand, f"{hand}: enumerate registry.SYSTEMS/ENGINE_SYSTEMS, or add to CODE_SUBSETS why not"
    gone = set(CODE_SUBSETS) - {(f, found) for f, found, _ in lists}
    assert not gone, f"{gone}: no longer in the code; remove from CODE_SUBSETS"


def test_the_published_figures_belong_to_the_systems_the_paper_compared():
    """Bagpipe (SOSP 2023) compared itself with FAE, HET and a parameter server without a
    cache: a scenario's `reported:` figures are shown beside those alone (`simulate/compare.py`)."""
    published = {n for n, s in registry.SYSTEMS.items() if s.published}
    assert published == {"bagpipe", "fae", "het", "sync"}
