"""What a run checks and says about itself: its own peak of resident rows, a NaN loss,
too few batches, a thin held-out AUC."""

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import policy_replay, user_warnings

from bagpipe_cli.cli import cli
from bagpipe_cli.data.format import open_dataset, table_offsets
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.planning.builders import trace_of
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS, spec
from bagpipe_cli.errors import ConfigError

SMALL = dict(batch_size=256, iterations=12, eval_rows=1000, lookahead=4)


def _trace(data, iterations, batch_size):
    ds = open_dataset(data)
    offs = table_offsets(ds.meta.cardinalities)
    keys = [ds.keys_block(b * batch_size, (b + 1) * batch_size, offs) for b in range(iterations)]
    return trace_of(keys, int(sum(ds.meta.cardinalities)))


@pytest.mark.parametrize("system", [s for s in ENGINE_SYSTEMS if spec(s).capacity_from_peak and spec(s).replicated])
def test_peak_resident_rows_is_the_runs_own(tiny_dataset, system):
    def peak(trace, capacity):  # the profile's simulator of its policy, or its decisions
        return policy_replay(system, trace, capacity)[1]

    trace = _trace(tiny_dataset, SMALL["iterations"], SMALL["batch_size"])
    bagpipe = train(TrainConfig(data=str(tiny_dataset), system="bagpipe", **SMALL)).summary
    assert bagpipe["bagpipe_peak_rows"] == bagpipe["peak_resident_rows"]
    # The default capacity is bagpipe's peak; the run's own peak is its policy's.
    s = train(TrainConfig(data=str(tiny_dataset), system=system, **SMALL)).summary
    assert s["bagpipe_peak_rows"] == s["cache_rows"] == bagpipe["peak_resident_rows"]
    assert s["peak_resident_rows"] == peak(trace, s["cache_rows"])
    # A cache larger than the run's rows never fills: its peak is not bagpipe's.
    s = train(TrainConfig(data=str(tiny_dataset), system=system, cache_rows=9000, **SMALL)).summary
    assert s["bagpipe_peak_rows"] == bagpipe["peak_resident_rows"] and s["cache_rows"] == 9000
    assert s["peak_resident_rows"] == peak(trace, 9000)
    assert bagpipe["peak_resident_rows"] < s["peak_resident_rows"] < 9000


def test_a_system_without_a_cache_has_no_peak(tiny_dataset):
    s = train(TrainConfig(data=str(tiny_dataset), system="sync", **SMALL)).summary
    assert s["peak_resident_rows"] is None and s["bagpipe_peak_rows"] is None
    assert s["eval_positives"] + s["eval_negatives"] == 1000 and s["eval_positives"] > 30


def test_a_nan_loss_stops_the_run_naming_the_iteration(tiny_dataset):
    with pytest.raises(ConfigError, match=r"the loss became NaN at iteration \d+; lower --lr"):
        train(TrainConfig(data=str(tiny_dataset), system="bagpipe", lr=1e6, **SMALL))


def test_train_warns_of_too_few_batches_and_a_thin_auc(tiny_dataset, tmp_path):
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--batch-size", "4096",
                                 "--iterations", "6", "--eval-rows", "40", "--out",
                                 str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    warnings = user_warnings(r.stderr)
    assert len(warnings) == 2, r.stderr
    assert "gives 4 batches of 4,096, fewer than the lookahead (16) and 10" in warnings[0]
    assert "the held-out AUC rests on" in warnings[1] and "fewer than 30 of one class" in warnings[1]
    # sync does not read the lookahead: only the count of batches is short
    res = train(TrainConfig(data=str(tiny_dataset), system="sync", batch_size=4096, iterations=6))
    got = user_warnings("\n".join(f"Warning: {w}" for w in res.warnings))
    assert len(got) == 1 and "fewer than 10:" in got[0]
    res = train(TrainConfig(data=str(tiny_dataset), system="sync", **SMALL))
    assert not user_warnings("\n".join(f"Warning: {w}" for w in res.warnings))


def test_the_memory_a_run_needs_is_checked_before_it_starts(tiny_dataset):
    cards = sum(open_dataset(tiny_dataset).meta.cardinalities)
    # The held-out forward (1,000 samples at a time) is the largest part, above the step's 256.
    with pytest.raises(ConfigError, match="--eval-rows 1000 --emb-dim 100000000: evaluating "
                                          "1,000 held-out samples of 8 rows of 100,000,000 "
                                          "floats at a time needs about .*; lower --eval-rows "
                                          "or --emb-dim$"):
        train(TrainConfig(data=str(tiny_dataset), emb_dim=10**8, **SMALL))
    with pytest.raises(ConfigError, match=f"--emb-dim 4096: a run over {cards:,} embedding rows "
                                          "of 4,096 floats with --cache-rows 2,000,000,000 needs "
                                          "about .*; lower --cache-rows$"):
        train(TrainConfig(data=str(tiny_dataset), cache_rows=2 * 10**9, emb_dim=4096, **SMALL))
    assert np.isfinite(train(TrainConfig(data=str(tiny_dataset), **SMALL)).summary["final_loss"])
