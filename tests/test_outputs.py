"""One rule owns every path a command writes (`outputs.check_output`), checked over the whole click
tree: a new command or option that writes a path is either declared an output, and checked
here, or fails the first test."""

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.cli.common import InputPath, OutputPath
from bagpipe_cli.files.outputs import FILE

HERE = Path(__file__).parent
REAL = HERE / "data" / "real"
EXAMPLE = HERE / "data" / "bench-example"
# Names a parameter that holds a path would have: such a parameter must be typed as one.
PATHLIKE = ("out", "dir", "path", "file", "trace", "save", "resume", "calibrate", "cluster",
            "validate", "data", "source", "config", "inputs", "results", "vocab")


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()):
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


def outputs():
    return [(words, p) for words, cmd in commands() for p in cmd.params
            if isinstance(p.type, OutputPath)]


def test_every_path_parameter_is_declared_an_input_or_an_output():
    for words, cmd in commands():
        for p in cmd.params:
            where = f"bagpipe {' '.join(words)} {p.opts[0]}"
            if isinstance(p.type, click.Path):
                assert isinstance(p.type, InputPath | OutputPath), where
                continue
            flag = isinstance(p, click.Option) and p.is_flag
            typed = isinstance(p.type, click.Choice) or p.type.name in ("integer", "float")
            if not (flag or typed) and any(w in p.name for w in PATHLIKE):
                pytest.fail(f"{where} looks like a path: type it InputPath or OutputPath")
    assert len(outputs()) >= 10


@pytest.fixture
def base(tiny_dataset, tmp_path):
    """Per command: arguments that reach its output check, and a fresh output of each option
    not under test (so that only the one under test is refused)."""
    csv = tmp_path / "in.csv"
    csv.write_text("y,a\n1,x\n0,z\n")
    return {
        ("synth",): ["--preset", "tiny", "--rows", "1000"],
        ("preprocess", "csv"): [csv, "--label", "y", "--categorical", "a"],
        ("preprocess", "criteo"): [REAL / "criteo_kaggle_train_head1999.tsv"],
        ("preprocess", "avazu"): [REAL / "deepctr_avazu_sample.txt"],
        ("profile",): [tiny_dataset],
        ("train",): [tiny_dataset, "--iterations", "2", "--batch-size", "64",
                     "--checkpoint-every", "1"],
        ("bench",): ["--quick"],
        ("report",): [EXAMPLE],
        ("simulate",): [tiny_dataset, "--compute-ms", "5"],
        ("advise",): [tiny_dataset, "--trainers", "2", "--net-gbps", "1", "--scale", "2"],
    }


def invoke(words, args, option, path, tmp_path, extra=()):
    """The command with `option` at `path`, every other output option at a fresh path."""
    cmd = dict(commands())[words]
    fresh = []
    for p in cmd.params:
        if isinstance(p.type, OutputPath) and p.opts[0] != option:
            fresh += [p.opts[0], tmp_path / f"fresh-{p.name}"]
    r = CliRunner().invoke(cli, [*words, *map(str, args), *map(str, fresh), option, str(path),
                                 *extra])
    return r


def _refused(r, option, *words):
    """Exit 2 and one error line (stderr) naming the option and holding `words`."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith(f"Error: {option} "), r.output
    for w in words:
        assert w in lines[0], r.output


def test_every_output_refuses_to_replace_a_users_file_a_link_a_fifo_or_a_device(base, tmp_path):
    assert {w for w, _ in outputs()} <= set(base), "add the new command to `base`"
    for words, p in outputs():
        option, makes = p.opts[0], p.type.makes
        has_overwrite = any(q.name == "overwrite" for q in dict(commands())[words].params)
        # A file of the user's: kept (a file where a folder belongs: always; else without
        # --overwrite).
        mine = tmp_path / f"mine-{'-'.join(words)}-{p.name}.csv"
        mine.write_text("user,data\n1,2\n")
        r = invoke(words, base[words], option, mine, tmp_path)
        _refused(r, option, str(mine), "not a directory" if makes != FILE else "exists; pass --overwrite")
        assert mine.read_text() == "user,data\n1,2\n"
        # A symbolic link: never replaced, --overwrite or not (nor what it points to).
        link = tmp_path / f"link-{'-'.join(words)}-{p.name}"
        link.symlink_to(mine)
        r = invoke(words, base[words], option, link, tmp_path, ["--overwrite"] if has_overwrite else [])
        _refused(r, option, "symbolic link")
        assert link.is_symlink() and mine.read_text() == "user,data\n1,2\n"
        # A FIFO and a device: never replaced.
        fifo = tmp_path / f"fifo-{'-'.join(words)}-{p.name}"
        os.mkfifo(fifo)
        r = invoke(words, base[words], option, fifo, tmp_path, ["--overwrite"] if has_overwrite else [])
        _refused(r, option, "FIFO")
        assert fifo.is_fifo()
        r = invoke(words, base[words], option, "/dev/null", tmp_path)
        _refused(r, option, "character device")
        assert Path("/dev/null").is_char_device()


def test_no_output_writes_into_a_bagpipe_folder_of_another_kind(base, tmp_path):
    """A dataset folder (or a run's) is never written over or into by another kind's output,
    --overwrite or not."""
    run, dataset = tmp_path / "a-run", tmp_path / "a-dataset"  # known by the files they hold
    for folder, files in ((run, ("summary.json", "config.json")), (dataset, ("meta.json", "labels.npy"))):
        folder.mkdir()
        for f in files:
            (folder / f).write_text("{}")
    for words, p in outputs():
        if p.type.makes == FILE:
            continue
        has_overwrite = any(q.name == "overwrite" for q in dict(commands())[words].params)
        victim, kind = (run, "run") if p.type.makes == "dataset" else (dataset, "dataset")
        before = sorted(x.name for x in victim.iterdir())
        r = invoke(words, base[words], p.opts[0], victim, tmp_path,
                   ["--overwrite"] if has_overwrite else [])
        _refused(r, p.opts[0])
        assert f"holds a {kind}" in r.output or "is the input" in r.output, r.output
        assert sorted(x.name for x in victim.iterdir()) == before


def test_every_output_refuses_a_path_it_cannot_write_in_one_line(base, tmp_path):
    """A symbolic link loop above it and an over-long name: exit 2, one line naming the
    option and the cause, before any work (a read-only folder: see the mounts below)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for words, p in outputs():
        option = p.opts[0]
        r = invoke(words, base[words], option, loop / "x", tmp_path)
        _refused(r, option, "symbolic link loop")
        r = invoke(words, base[words], option, tmp_path / ("n" * 300), tmp_path)
        _refused(r, option, "File name too long")


@pytest.fixture
def mount(tmp_path):
    """mount(options) -> a fresh tmpfs folder mounted with `options` (root only)."""
    mounted = []

    def make(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o {options} tmpfs {where} 2>/dev/null"):
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        os.system(f"umount {where}")


def test_every_output_on_a_read_only_file_system_is_refused_in_one_line(base, tmp_path, mount):
    ro = mount("ro,size=64k")
    for words, p in outputs():
        r = invoke(words, base[words], p.opts[0], ro / "x", tmp_path)
        _refused(r, p.opts[0], "Read-only file system")


@pytest.mark.parametrize("words, option, args", [
    (("preprocess", "criteo"), "--out", [REAL / "criteo_kaggle_train_head1999.tsv"]),
    (("profile",), "--out", ["DATA", "--batch-size", "256"]),
    (("train",), "--out", ["DATA", "--iterations", "2", "--batch-size", "64"]),
    (("train",), "--save-model", ["DATA", "--iterations", "2", "--batch-size", "64", "--out", "RUN"]),
    (("train",), "--trace", ["DATA", "--iterations", "2", "--batch-size", "64", "--out", "RUN"]),
    (("train",), "--checkpoint-dir", ["DATA", "--iterations", "4", "--batch-size", "64",
                                      "--checkpoint-every", "2", "--out", "RUN"]),
    (("report",), "--out", [EXAMPLE]),
    (("simulate",), "--out", ["DATA", "--compute-ms", "5", "--iterations", "20"]),
])
def test_a_full_disk_at_every_writer_is_one_line_and_leaves_nothing(words, option, args,
                                                                  tiny_dataset, tmp_path, mount):
    full = mount("size=4k")  # room for folders, not for their files
    args = [tiny_dataset if a == "DATA" else tmp_path / "run" if a == "RUN" else a for a in args]
    r = CliRunner().invoke(cli, [*words, *map(str, args), option, str(full / "x")])
    _refused(r, option, "No space left on device (the disk is full)")
    assert not list(full.iterdir())  # nothing half-written, no temporary left
    assert not (tmp_path / "run").exists()  # nor the run's other outputs


def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_and_names_it(
        tiny_dataset, tmp_path, monkeypatch):
    from bagpipe_cli.engine.records import checkpoint

    real, calls = checkpoint.torch_save, []

    def full_on_the_second(obj, target):
        calls.append(target)
        if len(calls) > 2:  # the second checkpoint's first file
            raise OSError(28, "No space left on device", str(target))
        real(obj, target)

    monkeypatch.setattr(checkpoint, "torch_save", full_on_the_second)
    ck = tmp_path / "ck"
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--iterations", "6", "--batch-size",
                                 "64", "--checkpoint-every", "2", "--checkpoint-dir", str(ck),
                                 "--out", str(tmp_path / "run")])
    _refused(r, "--checkpoint-dir", "before iteration 4 could not be written",
             f"the previous one, {ck / 'ckpt-00000002'}, is intact: --resume {ck / 'ckpt-00000002'}")
    assert checkpoint.find_checkpoint(ck).iteration == 2  # verified, and the newest
    assert [p.name for p in ck.iterdir()] == ["ckpt-00000002"]  # no partial one beside it
    assert not (tmp_path / "run").exists()
