"""Cache policies: the decisions `bagpipe profile` simulates and the engine's planners follow.

    table       every policy, its label, colour and what it needs (one table for all)
    trace       the batch trace: per batch the unique row keys in first-access order
    eviction    the queue of eviction candidates that lru, lfu and belady share
    simulators  exact trace-driven simulators of every policy, and the decisions they share
                with the engine's planners (hot rows, lfu priorities, capacity checks)
"""
