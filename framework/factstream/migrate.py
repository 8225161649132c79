"""Per-plugin alembic migrations: one environment, one version table, one branch per plugin.

The core's revisions form the branch ``factstream``; every plugin that registers a migrations
directory owns the branch labelled with its entry-point name, whose first revision ``depends_on`` the
core. Alembic stores only the minimal set of heads (a core head that a plugin revision depends on is
folded into the plugin's head), so factstream also records every branch's current revision in
``factstream_migration_branches``. That record is what lets ``status`` report each branch, and what
names the plugin behind a revision whose plugin is no longer installed (alembic alone would only say
"Can't locate revision"). Whether that plugin is gone or only left out by the environment
(``FACTSTREAM_BLOCK_PLUGINS``, ``FACTSTREAM_LOAD_PLUGINS``) the plugin manager knows, so the refusal names
the way out that applies: reinstall, unblock, or ``factstream migrate detach``.

All commands run in one transaction holding an advisory lock, so concurrent ``migrate`` calls from
several host processes are serialised and a failing revision leaves nothing half-applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from alembic.util import CommandError

from factstream.db.engine import sync_url
from factstream.db.metadata import migration_branches
from factstream.errors import FactstreamError, MigrationError
from factstream.plugin.manager import CORE_PLUGIN, LeftOut, PluginHost
from factstream.resources import migrations_dir

log = logging.getLogger(__name__)

CORE_BASE_REVISION = "fs_core_0001"
VERSION_TABLE = "alembic_version"
_LOCK_KEY = 0x66737467  # "fstg": serialises migrations across processes


@dataclass(frozen=True)
class BranchStatus:
    """One branch (core or plugin): where the database is and where the code is.

    A branch the database holds whose plugin is not loaded has ``installed`` False and no head. Its
    ``left_out`` says why, when the plugin is installed but the environment leaves it out (None: not
    installed); ``recorded`` is False when not even the branch table names a plugin for the revision
    (``branch`` is then ``(unknown: REVISION)``).
    """

    branch: str
    current: str | None
    head: str | None
    installed: bool = True
    left_out: LeftOut | None = None
    recorded: bool = True

    @property
    def up_to_date(self) -> bool:
        return self.installed and self.current == self.head

    @property
    def state(self) -> str:
        """What ``migrate status`` shows: ``up to date``, ``needs upgrade``, ``plugin not installed``, or
        why an installed plugin is not loaded (``blocked by FACTSTREAM_BLOCK_PLUGINS``)."""
        if not self.installed:
            return self.left_out.value if self.left_out is not None else "plugin not installed"
        return "up to date" if self.current == self.head else "needs upgrade"


def missing_plugin(row: BranchStatus) -> str:
    """Why the revision of ``row`` (a branch whose plugin is not loaded) has no owner, and the ways out
    that apply (docs/migrations.md, "Uninstalled and blocked plugins"): reinstall the plugin, unblock it
    or name it in ``FACTSTREAM_LOAD_PLUGINS``; or detach its migrations."""
    rev, plugin = row.current, row.branch
    if not row.recorded:
        return f"revision {rev!r} is not known to any installed plugin"
    detach = f"detach its migrations with `factstream migrate detach {plugin}` (its tables are kept)"
    if row.left_out is LeftOut.BLOCKED:
        way_back = f"Unblock it (take {plugin} out of FACTSTREAM_BLOCK_PLUGINS)"
    elif row.left_out is LeftOut.NOT_SELECTED:
        way_back = f"Load it (add {plugin} to FACTSTREAM_LOAD_PLUGINS)"
    else:
        way_back = "Reinstall it"
    why = "is not installed" if row.left_out is None else f"is installed but {row.left_out.value}"
    return f"revision {rev!r} belongs to plugin {plugin!r}, which {why}. {way_back}, or {detach}"


def missing_plugins(rows: Sequence[BranchStatus]) -> str:
    """The refusal of a database holding revisions of plugins that are not loaded (``rows``)."""
    whose = "a plugin that is" if len(rows) == 1 else "plugins that are"
    return f"the database has migrations of {whose} not loaded: " + "; ".join(map(missing_plugin, rows)) + "."


def not_ready(rows: Sequence[BranchStatus]) -> str | None:
    """Why an instance cannot start on a database whose branches are ``rows`` (:meth:`Migrator.status`);
    None when it can.

    Two problems, either or both: revisions of plugins that are not loaded (:func:`missing_plugins`,
    named first, since ``factstream migrate`` refuses to run until they are dealt with), and branches
    behind their head, for which the answer is ``factstream migrate``. A plugin that is blocked or
    uninstalled is never reported as behind: migrating cannot help it.
    """
    missing = [r for r in rows if not r.installed]
    behind = [r for r in rows if r.installed and not r.up_to_date]
    names = ", ".join(f"{s.branch} ({s.current or 'base'} -> {s.head or 'missing'})" for s in behind)
    if not missing:
        return f"the database is not migrated: {names}; run `factstream migrate` first" if behind else None
    also = f" The database is also not migrated: {names}; run `factstream migrate` after that." if behind else ""
    return missing_plugins(missing) + also


def require_migrated(url: str, plugins: PluginHost) -> None:
    """Raise :class:`FactstreamError` saying what to do (:func:`not_ready`) unless every branch of
    ``plugins`` is at its head in the database ``url`` and it holds no revision of a plugin not loaded:
    what ``factstream run``, ``factstream export`` and any command that needs the schema check first."""
    migrator = Migrator(url, plugins)
    try:
        problem = migrator.not_ready()
    finally:
        migrator.close()
    if problem is not None:
        raise FactstreamError(problem)


class Migrator:
    """Runs alembic for the core and every loaded plugin against one database."""

    def __init__(self, url: str, plugins: PluginHost) -> None:
        self.engine = sa.create_engine(sync_url(url), poolclass=sa.pool.NullPool)
        self.plugins = plugins
        self.branch_dirs: dict[str, Path] = {reg.plugin: reg.spec.versions_dir for reg in plugins.registry.migrations}
        self.config = Config()
        self.config.set_main_option("script_location", str(migrations_dir()))
        self.config.set_main_option("path_separator", "os")
        self.config.set_main_option("version_locations", ":".join(str(p) for p in self.branch_dirs.values()))
        self.config.set_main_option("version_table", VERSION_TABLE)
        self.script = ScriptDirectory.from_config(self.config)

    def close(self) -> None:
        self.engine.dispose()

    # -- queries -----------------------------------------------------------------------------------

    def branch_of(self, rev: Script) -> str | None:
        """The branch (plugin name) a revision belongs to: the directory its file is in."""
        parent = Path(rev.path).resolve().parent
        for name, path in self.branch_dirs.items():
            if path.resolve() == parent:
                return name
        return None

    def _revisions_in(self, branch: str) -> list[Script]:
        return [r for r in self.script.walk_revisions() if self.branch_of(r) == branch]

    def head_of(self, branch: str) -> str | None:
        heads = [r for r in self._revisions_in(branch) if not r.nextrev]
        if len(heads) > 1:
            raise MigrationError(
                f"migration branch {branch!r} has several heads ({', '.join(r.revision for r in heads)}); "
                "merge them with a revision whose down_revision lists both heads"
            )
        return heads[0].revision if heads else None

    def _currents(self, heads: tuple[str, ...]) -> dict[str, str]:
        """Each branch's current revision implied by the version table's ``heads`` (with dependencies)."""
        seen: dict[str, Script] = {}
        stack = list(heads)
        while stack:
            rid = stack.pop()
            for rev in self.script.revision_map.get_revisions(rid):
                if not isinstance(rev, Script) or rev.revision in seen:
                    continue
                seen[rev.revision] = rev
                stack.extend(rev._all_down_revisions)
        out: dict[str, str] = {}
        by_branch: dict[str, list[Script]] = {}
        for rev in seen.values():
            branch = self.branch_of(rev)
            if branch is not None:
                by_branch.setdefault(branch, []).append(rev)
        for branch, revs in by_branch.items():
            ids = {r.revision for r in revs}
            below = {d for r in revs for d in r._all_down_revisions if d in ids}
            tops = [r.revision for r in revs if r.revision not in below]
            out[branch] = tops[0]
        return out

    @contextmanager
    def _locked(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            yield conn

    @staticmethod
    def _db_heads(conn: sa.Connection) -> tuple[str, ...]:
        return tuple(MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads())

    @staticmethod
    def _recorded(conn: sa.Connection) -> dict[str, str]:
        if not sa.inspect(conn).has_table(migration_branches.name):
            return {}
        rows = conn.execute(sa.select(migration_branches.c.branch, migration_branches.c.revision))
        return {b: r for b, r in rows}

    def _unknown(self, conn: sa.Connection) -> dict[str, str]:
        """Revisions in the version table whose script is missing, mapped to the plugin recorded for them."""
        recorded_by_rev = {rev: branch for branch, rev in self._recorded(conn).items()}
        out = {}
        for rid in self._db_heads(conn):
            try:
                found = self.script.revision_map.get_revisions(rid)
            except Exception:
                found = ()
            if not found or found[0] is None:
                out[rid] = recorded_by_rev.get(rid, "")
        return out

    def _missing(self, unknown: dict[str, str], recorded: dict[str, str]) -> list[BranchStatus]:
        """The branches of the ``unknown`` revisions (:meth:`_unknown`): whose plugin is not loaded, and why."""
        out = []
        for rid, plugin in sorted(unknown.items()):
            if plugin:
                why = self.plugins.left_out.get(plugin)
                out.append(BranchStatus(plugin, recorded.get(plugin, rid), None, installed=False, left_out=why))
            else:
                out.append(BranchStatus(f"(unknown: {rid})", rid, None, installed=False, recorded=False))
        return out

    def _check_installed(self, conn: sa.Connection) -> None:
        missing = self._missing(self._unknown(conn), self._recorded(conn))
        if missing:
            raise MigrationError(missing_plugins(missing))

    def _sync_record(self, conn: sa.Connection) -> None:
        """Rewrite ``factstream_migration_branches`` from the version table (all scripts known)."""
        if not sa.inspect(conn).has_table(migration_branches.name):
            return
        currents = self._currents(self._db_heads(conn))
        conn.execute(sa.delete(migration_branches))
        if currents:
            conn.execute(
                sa.insert(migration_branches), [{"branch": b, "revision": r} for b, r in sorted(currents.items())]
            )

    def status(self) -> list[BranchStatus]:
        """Every branch: installed ones with their head, plus recorded branches whose plugin is gone."""
        with self.engine.connect() as conn:
            heads = self._db_heads(conn)
            unknown = self._unknown(conn)
            recorded = self._recorded(conn)
            currents = self._currents(tuple(h for h in heads if h not in unknown))
        # A branch folded into a missing plugin's head is only known from the record, which every
        # migration rewrites from the whole version table: where a head is unknown, the recorded
        # revision wins over what the known heads imply when it lies further along the branch (a
        # plugin's first revision depends on the core's head: with that plugin gone, the other
        # plugins' heads reach only the core's first revision).
        for branch, rev in recorded.items():
            if branch not in self.branch_dirs:
                continue
            if branch not in currents or (unknown and self._descends(rev, currents[branch])):
                currents[branch] = rev
        out = [BranchStatus(b, currents.get(b), self.head_of(b)) for b in self._ordered_branches()]
        return out + self._missing(unknown, recorded)

    def _descends(self, rev: str, ancestor: str) -> bool:
        """Whether the known revision ``rev`` comes after ``ancestor`` (is it, or has it below)."""
        try:
            known = self.script.revision_map.get_revisions(rev)
        except Exception:
            return False
        if not known or known[0] is None:
            return False
        seen, stack = set(), [rev]
        while stack:
            rid = stack.pop()
            if rid == ancestor:
                return True
            if rid in seen:
                continue
            seen.add(rid)
            for found in self.script.revision_map.get_revisions(rid):
                if isinstance(found, Script):
                    stack.extend(found._all_down_revisions)
        return False

    def not_ready(self) -> str | None:
        """Why an instance cannot start on this database (:func:`not_ready`); None when it can."""
        return not_ready(self.status())

    def _ordered_branches(self) -> list[str]:
        return [CORE_PLUGIN, *sorted(b for b in self.branch_dirs if b != CORE_PLUGIN)]

    def _require_branch(self, plugin: str) -> None:
        if plugin not in self.branch_dirs:
            loaded = plugin in self.plugins.plugins
            why = "registers no migrations (add a register_migrations hook)" if loaded else "is not a loaded plugin"
            raise MigrationError(f"plugin {plugin!r} {why}; branches: {', '.join(self._ordered_branches())}")

    # -- commands ----------------------------------------------------------------------------------

    def _run(self, fn: str, target: str) -> None:
        with self._locked() as conn:
            self._check_installed(conn)
            self.config.attributes["connection"] = conn
            try:
                getattr(command, fn)(self.config, target)
            except CommandError as exc:
                raise MigrationError(f"alembic could not {fn} to {target!r}: {exc}") from exc
            except Exception as exc:
                cause = getattr(exc, "orig", None) or exc  # the database's own error, not SQLAlchemy's wrapper
                where = f" ({type(cause).__module__}.{type(cause).__name__})"
                reason = " ".join(str(cause).split("\n")[0].split())
                raise MigrationError(
                    f"migration {fn} to {target!r} failed{where}: {reason}. Nothing was applied: "
                    "every migrate command runs in one transaction"
                ) from exc
            finally:
                self.config.attributes.pop("connection", None)
            self._sync_record(conn)

    def upgrade(self, plugin: str | None = None) -> None:
        """Upgrade every branch to its head, or only ``plugin``'s (and what it depends on)."""
        if plugin is None:
            self._run("upgrade", "heads")
            return
        self._require_branch(plugin)
        if self.head_of(plugin) is None:
            log.info("plugin %s has no revisions yet", plugin)
            return
        self._run("upgrade", f"{plugin}@head")

    def downgrade_to_base(self, plugin: str) -> None:
        """Downgrade ``plugin``'s branch (and anything depending on it) to before its first revision."""
        self._require_branch(plugin)
        if self.head_of(plugin) is None:
            return
        self._run("downgrade", f"{plugin}@base")

    def applied_revisions(self, plugin: str) -> list[Script]:
        """The revisions of ``plugin``'s branch the database is at or past, newest first: what
        :meth:`downgrade_to_base` would undo (``[]`` when the branch is not applied)."""
        self._require_branch(plugin)
        current = next((row.current for row in self.status() if row.branch == plugin), None)
        applied: list[Script] = []
        rev = self.script.get_revision(current) if current else None
        while rev is not None and self.branch_of(rev) == plugin:
            applied.append(rev)
            down = rev.down_revision
            rev = self.script.get_revision(down) if isinstance(down, str) else None
        return applied

    def new_revision(self, plugin: str, message: str) -> Path:
        """Write a new empty revision at the head of ``plugin``'s branch (starting it if needed)."""
        self._require_branch(plugin)
        directory = self.branch_dirs[plugin]
        head = self.head_of(plugin)
        try:
            if head is None:
                if plugin == CORE_PLUGIN:
                    raise MigrationError("the core branch has no revisions; factstream is incomplete")
                script = command.revision(
                    self.config,
                    message=message,
                    head="base",
                    branch_label=plugin,
                    version_path=str(directory),
                    depends_on=self.head_of(CORE_PLUGIN),
                )
            else:
                script = command.revision(
                    self.config, message=message, head=f"{plugin}@head", version_path=str(directory)
                )
        except CommandError as exc:
            raise MigrationError(f"cannot create a revision for {plugin!r}: {exc}") from exc
        assert isinstance(script, Script)
        self.script = ScriptDirectory.from_config(self.config)
        return Path(script.path)

    def detach(self, plugin: str) -> str:
        """Forget an uninstalled plugin's migrations (its tables stay); returns the revision removed."""
        if plugin in self.branch_dirs:
            raise MigrationError(
                f"plugin {plugin!r} is installed; use `factstream migrate down --plugin {plugin}` instead"
            )
        with self._locked() as conn:
            recorded = self._recorded(conn)
            rid = recorded.get(plugin)
            heads = self._db_heads(conn)
            if rid is None or rid not in heads:
                raise MigrationError(f"the database records no migrations of plugin {plugin!r}")
            version = sa.table(VERSION_TABLE, sa.column("version_num"))
            conn.execute(sa.delete(version).where(version.c.version_num == rid))
            conn.execute(sa.delete(migration_branches).where(migration_branches.c.branch == plugin))
            # Branches that alembic had folded into the detached head must be written back.
            remaining = tuple(h for h in heads if h != rid)
            covered = self._currents(tuple(h for h in remaining if h not in self._unknown(conn)))
            for branch, rev in recorded.items():
                if branch != plugin and branch in self.branch_dirs and covered.get(branch) != rev:
                    conn.execute(sa.insert(version).values(version_num=rev))
            return rid
