"""Where a job's processes and threads run, and what they were run on: local rank processes,
shaped links, core placement, the machine's load and environment, signals.

    processes   start a job's ranks as local processes and report one cause when one fails
                (`bagpipe train --procs`, and the TorchRec runner's trainers)
    forkserver  fork the ranks from one process that imported torch once (a test session's)
    netshape    `--net-shape`: each rank in a network namespace behind a rate-limited link
    placement   which cores the trainer's torch threads get, and which the helpers get
    contention  how much of the machine a run had (load, waits for a CPU), in its summary
    environment the machine and software a result was made on (environment.json)
    signals     SIGTERM and SIGHUP end a run as Ctrl-C does (installed first by the script)
"""
