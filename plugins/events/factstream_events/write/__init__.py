"""The write wing: a batch checked, planned (``plan.BatchPlan``), stamped and written one table per
step (``persist``, ``steps``), local events created, redactions censored. It never imports the read
wing."""
