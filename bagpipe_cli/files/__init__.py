"""What bagpipe writes, and what it reads back: nothing of the user's lost, nothing half-written.

    outputs      the one rule for every path a command writes (`check_output`), before any work
    claims       one writer per output path, across processes (`.NAME.bagpipe-claim`)
    temporaries  the temporaries beside an output: marked, listed in its claim, published by a
                 rename that replaces nothing, removed only when the claim and the mark agree
    atomic       atomic files and folders (`atomic_file`, `atomic_dir`), `torch_save`, `write_json`,
                 UTF-8 text and YAML inputs, stored input paths
    records      the one reader of every JSON, YAML and TOML record bagpipe reads back, with limits
"""
