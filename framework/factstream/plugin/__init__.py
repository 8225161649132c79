"""The plugin system: hook specifications, the plugin manager, the registry and the frozen specs plugins
register, and the core's own registrations made through the same hooks.

Modules, lowest first (each imports only those before it):

``specs``
    The frozen, typed specs a plugin registers (caches, invalidations, migrations, routes, ...).
``streams``
    ``StreamSpec`` and what a stream plugin hands the host (``StreamTable``, ``SyncRequest``, ``Wake``).
``hookspecs``
    The core's hook specifications and the markers: ``hookspec`` (for plugins' own hooks too) and
    ``hookimpl`` (with ``defined_by`` for another plugin's hooks).
``registry``
    Everything plugins registered, validated, in a stable order.
``core``
    The core's own hook implementations (the plugin named ``factstream``).
``manager``
    Discovery through entry points, allow/block lists, tracing, the hooks plugins define
    (``register_hookspecs``), typed hook calls.

This package's ``__init__`` imports nothing, so importing one of its modules never drags in the others.
"""
