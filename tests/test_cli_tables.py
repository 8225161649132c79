"""The CLI's tables at 80 columns (issue 44, item 9 and its siblings): names a user types are never cut
to an ellipsis or wrapped; other columns give way (they fold, whole)."""

from __future__ import annotations

from factstream.plugin.manager import load_plugins


def test_the_plugins_table_cuts_no_name_at_80_columns(cli):
    result = cli("plugins", env={"PATH": "/usr/bin:/bin"}, columns=80)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout, result.stdout
    assert max(map(len, lines)) <= 80
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    host = load_plugins()
    assert len(host.plugins) >= 5
    for name in host.plugins:
        assert any(row[0] in (name, f"{name} (core)") for row in rows), (name, result.stdout)
        if name in host.registry.migrations:
            # the columns: plugin, version, module, streams, migration branch, needs
            assert any(row[4] == name for row in rows), (name, result.stdout)
