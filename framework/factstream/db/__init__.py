"""Database access: ``engine`` (async engine, URL choice), ``embedded`` (the default server) and
``metadata`` (the shared MetaData). Submodules are imported where needed so that ``import factstream``
stays cheap."""
