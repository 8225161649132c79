"""What the write and the read wings share: the stored-event row and its SQL, the clock, state groups,
the served view, the streams' rows, the caches, the settings and the sharding of rooms."""
