"""Communication: how rows, gradients and sums move, and what it costs.

    transport   a trainer process <-> the servers (interface)
    collective  sums among trainers (interface); `ordered_sum`
    shards      one server's rows: storage, initialisation, gather/scatter
    network     the emulated network's transfer and all-reduce times
    traffic     bytes sent and received by role and kind (`summary.json`'s `roles.*.traffic`)
"""
