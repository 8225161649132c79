"""Tests of factstream.sync: tokens, the key layout, instance IDs and the notifier."""
