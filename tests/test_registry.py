"""No list of systems is written by hand: every one is made from the registry.

Code, help texts and docs ask the registry (`ENGINE_SYSTEMS`, `names_where`, `bagpipe
systems`); a bench or cluster file that means every system names a group (`all`,
`simulated`, `each-model`), and a table of the docs that must cover every traffic model
`simulate` has is keyed by the model (a registry entry's `volumes`), not by system.
`LISTINGS` names each such list and what it must hold, and `test_every_list_names_every_system`
fails naming the file and the entry it lacks. A file that names several systems on purpose
(prose about some of them) is in `SUBSETS`, with the reason. No string literal of the
package lists three or more system names (`test_no_string_lists_systems`), and lists in
code (tests, benchmarks) of three or more are in `CODE_SUBSETS`, with the reason.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from bagpipe_cli.engine import registry
from bagpipe_cli.engine.registry import SystemSpec
from bagpipe_cli.policies.table import policy_names

ROOT = Path(__file__).resolve().parents[1]
Systems = dict[str, SystemSpec]


def _groups(name: str) -> Callable[[Systems], list[set[str]]]:
    """Every system of registry group `name`."""
    return lambda systems: [{n} for n in registry.group(name, systems)]


def _model(s: SystemSpec) -> str:
    """A system's traffic model: its `volumes` function's name without `_volumes`."""
    return (s.volumes or "").partition(":")[2].removesuffix("_volumes")


def _models(systems: Systems) -> list[set[str]]:
    """Every traffic model `simulate` has (a registry entry's `volumes`)."""
    return [{m} for m in dict.fromkeys(_model(s) for s in systems.values() if s.volumes)]


def _words(text: str, systems: Systems) -> set[str]:
    """The registered systems `text` names as words."""
    return {n for n in systems if re.search(rf"(?<![\w/.-]){re.escape(n)}(?![\w/-])", text)}


def _block(lines: list[str], anchor: str) -> list[str]:
    """The lines from the one holding `anchor` up to the next blank line."""
    start = next((i for i, ln in enumerate(lines) if anchor in ln), None)
    assert start is not None, f"{anchor!r} is not there any more: update LISTINGS"
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def model_table(anchor: str) -> Callable[[str, Systems], set[str]]:
    """The models named first (in backticks) in the first column of the Markdown table whose
    header holds `anchor`."""
    def names(text: str, systems: Systems) -> set[str]:
        return {m for ln in _block(text.splitlines(), anchor)[2:]
                for m in re.findall(r"`(\w+)`", ln.split("|")[1])}
    return names


def _expanded(entries: list, systems: Systems) -> set[str]:
    """A `systems:` list's systems, its groups expanded among `systems`."""
    out = set()
    for e in entries:
        name = e["name"] if isinstance(e, dict) else e
        out |= set(registry.group(name, systems) or {name} if not isinstance(e, dict) else {name})
    return out & set(systems)


def yaml_file(text: str, systems: Systems) -> set[str]:
    """The systems of a bench or cluster file's `systems` (a group, or a list)."""
    v = yaml.safe_load(text)["systems"]
    return _expanded(v if isinstance(v, list) else [v], systems)


def yaml_example(anchor: str) -> Callable[[str, Systems], set[str]]:
    """The `systems` of the YAML code block that follows `anchor` in a Markdown page."""
    def names(text: str, systems: Systems) -> set[str]:
        after = text.split(anchor, 1)[1]
        return yaml_file(after.split("```yaml\n", 1)[1].split("```", 1)[0], systems)
    return names


@dataclass(frozen=True)
class Listing:
    path: str
    what: str  # the list, in words (the failure names it)
    names: Callable[[str, Systems], set[str]]  # what it names (systems, or models), from its text
    wants: Callable[[Systems], list[set[str]]]  # what it must name: one of each set


LISTINGS = (
    Listing("README.md", "the quick bench file shown", yaml_example("A YAML or TOML matrix"),
            _groups("all")),
    Listing("docs/performance-model.md", "the table of what each model exposes",
            model_table("| what is exposed |"), _models),
    Listing("docs/performance-model.md", "the table of a round's plan bytes",
            model_table("| bytes of a round's plan |"), _models),
    *(Listing(f"benchmarks/{name}.yaml", "systems (all: every system of the engine)", yaml_file,
              _groups("all"))
      for name in ("quick", "paper", "criteo-kaggle", "distributed")),
    Listing("benchmarks/paper-scenario.yaml", "systems (every system simulate models)", yaml_file,
            _groups("simulated")),
    Listing("benchmarks/distributed-validate.yaml", "systems (one of each traffic model)",
            yaml_file, _groups("each-model")),
)

# Files that name systems but list only some, on purpose.
SUBSETS = {
    "README.md": "prose on the systems that need more than `bagpipe systems`' line",
    "docs/architecture.md": "the published designs behind the built-in systems, one by one",
    "docs/performance-model.md": "each model's formulas name the systems they were drawn from",
    "benchmarks/het-tradeoff.yaml": "het's staleness against sync and bagpipe",
    "benchmarks/successors.yaml": "bagpipe against the systems after it (hotline, slipstream, "
                                  "prefetch) and the two they build on (fae, sync)",
    "benchmarks/hotline-model.yaml": "hotline's performance model: hotline beside fae (its "
                                     "transfers) and sync",
    "benchmarks/rank0-sweep.yaml": "the N-sweep: one system per kind of plan (|U_b|, lookahead, policy) and the sharded tables",
    "benchmarks/sharded-validate.yaml": "simulate --validate of the sharded tables",
    "benchmarks/torchrec.yaml": "the external torchrec beside the engine's sync, local, bagpipe and sharded",
    "docs/benchmarks.md": "measured figures, each of the systems run at the commit it names",
    "docs/terabyte.md": "the Terabyte-scale profile's measured stages",
}


def missing_from_lists(systems: Systems) -> list[str]:
    """'file: list lacks entry' for every list in LISTINGS that lacks one of its entries."""
    out = []
    for ls in LISTINGS:
        named = ls.names((ROOT / ls.path).read_text(), systems)
        for want in ls.wants(systems):
            if not want & named:
                out.append(f"{ls.path}: {ls.what} lacks {' or '.join(sorted(want))}")
    return out


def test_every_list_names_every_system():
    assert not missing_from_lists(registry.SYSTEMS), (
        "name the group (all, simulated, each-model) or add the model's row")


def test_a_new_system_is_in_every_list_but_a_new_model_is_not():
    """A system registered and listed nowhere is in every list (they name groups); only the
    docs' tables of models lack the traffic model it brings."""
    fake = replace(registry.SYSTEMS["lru"], name="fakecache", volumes="tests:fake_volumes")
    found = missing_from_lists({**registry.SYSTEMS, "fakecache": fake})
    assert sorted(found) == sorted(f"{ls.path}: {ls.what} lacks fake" for ls in LISTINGS
                                   if ls.wants is _models), found
    same = replace(registry.SYSTEMS["lru"], name="fakecache")  # lru's model: nothing lacks it
    assert missing_from_lists({**registry.SYSTEMS, "fakecache": same}) == []


def test_a_hand_written_list_is_found_lacking(tmp_path, monkeypatch):
    """A bench file that lists the systems by hand lacks the next one: the failure names it."""
    hand = tmp_path / "hand.yaml"
    hand.write_text("systems: [" + ", ".join(registry.ENGINE_SYSTEMS) + "]\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LISTINGS",
                        (Listing("hand.yaml", "systems", yaml_file, _groups("all")),))
    fake = replace(registry.SYSTEMS["local"], name="fakelocal")
    assert missing_from_lists({**registry.SYSTEMS, "fakelocal": fake}) == [
        "hand.yaml: systems lacks fakelocal"]


def _named_files() -> list[str]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.yaml")]
    engine = {n: s for n, s in registry.SYSTEMS.items() if not s.external}
    return sorted(str(p.relative_to(ROOT)) for p in files if len(_words(p.read_text(), engine)) >= 3)


def test_every_file_that_names_systems_is_checked_or_a_known_subset():
    listed = {ls.path for ls in LISTINGS}
    unknown = [f for f in _named_files() if f not in listed and f not in SUBSETS]
    assert not unknown, f"{unknown}: add their lists of systems to LISTINGS or the file to SUBSETS"
    assert all((ROOT / f).exists() for f in SUBSETS)


_ALT = "|".join(map(re.escape, sorted(registry.ALL_SYSTEMS, key=len, reverse=True)))
_ITEM = rf"`?(?:{_ALT})`?(?:'s)?"
_SEP = r"(?:\s*[,/|]\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)"
_RUN = re.compile(rf"(?<![\w/.-]){_ITEM}(?:{_SEP}{_ITEM})+(?![\w/-])")


def string_lists(text: str) -> list[str]:
    """The runs of three or more system names in `text` ("lru, lfu and fae", "a/b/c")."""
    return [m.group(0) for m in _RUN.finditer(text)
            if len(set(re.findall(rf"\b({_ALT})\b", m.group(0)))) >= 3]


def test_string_lists_are_found():
    assert string_lists("fixed caches (lru, lfu and fae) here") == ["lru, lfu and fae"]
    assert string_lists("cache rows of bagpipe/lru/lfu/fae") == ["bagpipe/lru/lfu/fae"]
    assert string_lists("sync and bagpipe; later local") == []


def test_no_string_lists_systems():
    """No string of the package (help, docstring, message) lists three or more systems:
    such a list is made from the registry, or says what the systems have in common."""
    found = []
    for p in sorted((ROOT / "bagpipe_cli").rglob("*.py")):
        if p.relative_to(ROOT).as_posix() == "bagpipe_cli/engine/registry.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{p.relative_to(ROOT)}:{node.lineno}: {r!r}" for r in string_lists(node.value)]
    assert not found, found


# Lists of three or more system names in code, on purpose; the rest enumerate the registry.
CODE_SUBSETS = {
    ("tests/test_advise.py", frozenset({"sync", "bagpipe", "local"})):
        "a winner, the baseline and a system without fetches: advise's run kept short",
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
    ("tests/test_checkpoint.py", frozenset({"lru", "hotline", "sharded-hot", "local"})):
        "resumed over torch.distributed in make test-all beside bagpipe's partitioned cache: "
        "victims written back, a split batch, shards with replicated hot rows, whole tables",
    ("benchmarks/bench_feed.py", frozenset({"local", "sync", "bagpipe"})):
        "the default --systems timed: one without a view of U_b, two with",
    ("benchmarks/bench_gpu.py", frozenset({"local", "sync", "bagpipe"})):
        "the engine on a GPU: the bound, the reference and ours",
    ("benchmarks/bench_placement.py", frozenset({"sync", "bagpipe", "local"})):
        "the placement's effect on the reference, ours and the bound",
    ("benchmarks/bench_torchrec.py", frozenset({"torchrec", "local", "sync", "bagpipe", "sharded"})):
        "torchrec against the engine's bound, reference, ours and its own design in the engine",
    ("benchmarks/bench_sharded.py", frozenset({"sync", "sharded", "sharded-hot"})):
        "the sharded tables, with and without their hot set, against the reference",
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
                policies = {e.value for e in firsts if isinstance(e, ast.Constant)} & set(policy_names())
                if len(found) >= 3 and not policies - names:  # else: a list of policies
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
