"""Database access: ``database`` (the run-time pool and transactions), ``engine`` (URL choice and
connection checks), ``embedded`` (the default server) and ``metadata`` (the shared MetaData).

Submodules are imported where needed so that ``import factstream`` stays cheap.
"""
