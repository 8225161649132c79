# ${dist}

A factstream plugin: ${description}.

It adds the `${name}` stream: an append-only log of facts `{user_id, key, value}`, each with an
integer stream ID, written by ${", ".join("`" + w + "`" for w in writers)} into PostgreSQL and replicated to
every other factstream instance.

| piece | where |
|---|---|
| the row type, the stream, which cache a row invalidates | `${package}/rows.py` |
| the backing table and its sequence (alembic branch `${name}`) | `${package}/migrations/` |
| appending, and a cached count per key | `${package}/store.py` |
| `POST /${name}` and `GET /${name}/{key}` | `${package}/routes.py` |
| settings: the `plugins.${name}` section of the configuration | `${package}/settings.py` |
| the hooks that hand each piece to factstream | `${package}/__init__.py` |
% if sync:
| `/sync`: each user gets their own facts under `streams.${name}` (token key `${name}_key`) | `StreamSpec` in `rows.py` |
% endif
% if export:
| the Spark export job `${name}_all` (every fact, as Parquet) | `register_export_jobs` in `__init__.py` |
% endif
| tests: entry point, migrations, replication, cache invalidation${", /sync" if sync else ""}${", export" if export else ""} | `tests/` |

${"##"} Install

Next to factstream, in the environment that runs it:

```sh
uv pip install -e .        # or: pip install -e .
factstream plugins         # lists ${name}, its stream and its migration branch
```

${"##"} Migrate

```sh
factstream migrate                         # every branch to its head, this plugin's included
factstream migrate status                  # where each branch is
factstream migrate down --plugin ${name}   # drop what this plugin's revisions created
```

To change the table later, add a revision to this plugin's branch and fill in its `upgrade` and
`downgrade`:

```sh
factstream migrate new --plugin ${name} -m "add a column"
```

${"##"} Run

The stream is written by the instances listed under `stream_writers` in the configuration; every other
instance reads it over replication, which goes through `main` (it must run):

```yaml
# factstream.yaml
instance_map:
  main: {host: 127.0.0.1, replication_port: 9092, http_port: 8008}
% for i, writer in enumerate(w for w in writers if w != "main"):
  ${writer}: {host: 127.0.0.1, http_port: ${8010 + i}}
% endfor
  ${reader}: {host: 127.0.0.1, http_port: 8009}
stream_writers:
  ${name}: [${", ".join(writers)}]
http:
  tokens:
    service-token: {user: "@service:example.org", write: true}
    alice-token: {user: "@alice:example.org"}
plugins:
  ${name}:
    max_value_length: 1000
```

```sh
% for instance in instances:
factstream --config factstream.yaml run --instance ${instance} &
% endfor
curl -s -H "Authorization: Bearer service-token" -d '{"user_id": "@alice:example.org", "key": "k1", "value": "v1"}' http://127.0.0.1:${8008 if writers[0] == "main" else 8010}/${name}
curl -s -H "Authorization: Bearer alice-token" http://127.0.0.1:8009/${name}/k1
% if sync:
curl -s -H "Authorization: Bearer alice-token" http://127.0.0.1:8009/sync
% endif
% if export:
factstream --config factstream.yaml export ${name}_all
% endif
```

${"##"} Test

The tests use `factstream.testing` (a pytest plugin that comes with factstream): hosts in this process
replicating over TCP, and a PostgreSQL of their own (`FACTSTREAM_TEST_DATABASE_URL` when set, an
embedded server otherwise).

They need factstream's `testing` extra (pytest, pytest-asyncio, httpx and pytest-xdist), in the same
environment:

```sh
uv pip install "factstream[testing]"      # or: pip install "factstream[testing]"
pytest                                    # one test at a time
pytest -n auto                            # one worker per core
```

In parallel, each worker has its own databases (every test makes one), its own TCP ports (`free_port()`
draws from the worker's range, `FACTSTREAM_PORTS`) and, over Redis, its own channels: the fixtures need
nothing more from your tests. A test that asserts a time bound is better run alone: mark it, and run
those after the others (`pytest -n auto -m "not serial"`, then `pytest -m serial`).

${"##"} What to edit first

1. **The row**: the fields of `${camel}Row` in `rows.py`, in the order replication sends them, and
   their columns in the first migration (before anyone has migrated; afterwards, in a new revision).
2. **What a row makes stale**: `stale_counts` in `rows.py` returns the cache keys a fact changes.
   Every cached read of the stream's table needs such a function, or it serves stale answers.
3. **The routes** in `routes.py`: the checks a fact must pass before it is written.
% if sync:
4. **Who sees a fact in `/sync`**: `user_field` of the `StreamSpec` (or `sync_rows` and `wake` for
   anything else than "the user named in the row").
% endif

The guide to every hook is factstream's `docs/writing-plugins.md`.
