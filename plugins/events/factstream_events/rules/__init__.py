"""The Matrix rules, pure: canonical JSON, event IDs, pruning, validation, content rules, the local
policy, state resolution, visibility and room tokens. No I/O; nothing of the plugin above them."""
