"""The read wing: events as a user may see them (``reads``), room timelines and their change caches
(``timeline``) and the rooms section of ``/sync`` (``sync``). It never imports the write wing."""
