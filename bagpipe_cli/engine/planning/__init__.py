"""Planning: what rank 0 (the planner) decides before the trainers need it.

    feed      global batches in order, and (plan, batches) round by round
    keys      a batch's global row keys; U_b and each access's place in it
    oracle    Bagpipe's Oracle Cacher: fetch, evict, slots and LRPP classes per iteration
    partition LRPP's physical partition: each row's writers, home and source
    builders  the plan builders the registry names; a policy's planner (`PolicyPlanner`)
    plans     the plan types every part reads (`RoundPlan`, `IterPlan`, the row classes)
"""
