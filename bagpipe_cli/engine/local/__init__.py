"""The in-process runtime: every role in one process (threads), the same loop as distributed.

    runtime     `train_in_process(cfg)`: sets the roles up, runs the loop, assembles the result
    planner     the planner thread: plans rounds ahead into a bounded queue
    server      serving threads: one per embedding server, FIFO, holding the emulated link
    transport   a trainer's side of the serving threads
    collective  sums among the trainers of the process (already complete; timed when emulated)
"""
