"""Every repository path the documentation cites exists, so a reader who follows one finds it.

The pages under docs/, the README and the stream-plugin template's README cite files two ways: in
code spans (`framework/factstream/host/pipeline.py`, `uv run python benchmarks/run.py`) and in
Markdown links (`[Layers](architecture.md#layers)`). A word of a code span cites the repository when
it starts with one of the repository's top-level names, taken from git (`plugins/`, `dev`,
`mkdocs.yml`), or climbs out of the page's folder (`../`); what a user creates (`.factstream/`,
`site/`, `.venv/`) starts with none of them and is not checked. A relative link, and a word that
climbs, are resolved from the page's folder, as mkdocs and GitHub resolve a link, and must name a
file or folder of the repository. "The repository" is what a fresh clone of this tree would hold:
tracked files and files not yet added that git does not ignore (one ``git ls-files``).

What a word carries around its path is dropped: punctuation, a ``:LINE`` or ``::test_name`` suffix,
an ``#anchor``. A word with a placeholder (``plugins/<name>/``, ``${package}/rows.py``) or an
ellipsis names no one path and is skipped; a glob (``plugins/*/README.md``) passes when it matches
something. Fenced code blocks hold commands and their output, not citations, and are not read.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent

#: The documents checked, as globs under the repository root.
DOCUMENTS = ("docs/**/*.md", "README.md", "templates/**/README*.md", "templates/**/README*.md.mako")

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
#: The ``](target)`` of an inline link or image (its text may have begun on an earlier line).
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: A reference definition: ``[name]: target``.
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)")
#: A scheme (``https:``, ``mailto:``) or a protocol-relative ``//``: another site.
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
#: What stands for a name the reader chooses (``<name>``, ``${package}``, ``{room_id}``), or leaves
#: a path unfinished (``...``).
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.|…")
GLOB = re.compile(r"[*?\[]")

#: Paths a page names on purpose although the tree no longer has them, per page: a decision tells
#: what the tree was before it. Nothing else belongs here; a current page names what is there.
GONE_ON_PURPOSE = {
    # decision 29 names the test folders it renamed
    "docs/decisions.md": frozenset({"tests/plugins/", "tests/events/", "tests/plugins_bundled/"}),
}


@dataclass(frozen=True)
class Repository:
    """The files of a tree (paths from its root, ``/``-separated), and what follows from them."""

    files: frozenset[str]

    @cached_property
    def top_level(self) -> frozenset[str]:
        return frozenset(name.split("/", 1)[0] for name in self.files)

    @cached_property
    def names(self) -> frozenset[str]:
        """Every file and every folder above one."""
        folders = {str(parent) for name in self.files for parent in PurePosixPath(name).parents}
        return self.files | (folders - {"."})

    def holds(self, path: str) -> bool:
        """Whether ``path`` names a file or a folder (with or without its ``/``) of the tree; a glob
        does when it matches one."""
        path = path.rstrip("/")
        if GLOB.search(path):
            return any(fnmatch.fnmatchcase(name, path) for name in self.names)
        return path in self.names


@cache
def this_repository() -> Repository:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    # a file deleted in the work tree, its deletion not yet staged, is gone for a reader of this tree
    return Repository(frozenset(name for name in listed.split("\0") if name and (ROOT / name).exists()))


def documents() -> list[str]:
    return sorted({p.relative_to(ROOT).as_posix() for pattern in DOCUMENTS for p in ROOT.glob(pattern)})


def missing_citations(document: str, text: str, repository: Repository) -> list[str]:
    """One "DOC:LINE cites PATH, which does not exist" for each path that ``text`` (the document
    ``document``, named from the root) cites and ``repository`` lacks."""
    folder = PurePosixPath(document).parent
    gone_on_purpose = GONE_ON_PURPOSE.get(document, frozenset())
    missing: list[str] = []
    for number, line in _prose_lines(text):
        cited = [(path, True) for span in CODE_SPAN.findall(line) for path in map(_bare, span.split())]
        links = INLINE_LINK.findall(CODE_SPAN.sub("code", line)) + REFERENCE_LINK.findall(line)
        cited += [(target.split("#", 1)[0].split("?", 1)[0], False) for target in links]
        for path, in_code in cited:
            if not path or PLACEHOLDER.search(path) or EXTERNAL.match(path) or path in gone_on_purpose:
                continue
            if in_code and not path.startswith("../"):
                if path.split("/", 1)[0] not in repository.top_level:
                    continue  # not a path of the repository: a command, a name, what a user creates
                resolved: str | None = path
            else:
                resolved = _resolve(folder, path)
            if resolved is None:
                missing.append(f"{document}:{number} cites {path}, which is outside the repository")
            elif not repository.holds(resolved):
                where = "" if resolved == path else f" ({resolved})"
                missing.append(f"{document}:{number} cites {path}, which does not exist{where}")
    return missing


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The numbered lines of a Markdown text outside its fenced code blocks."""
    fence = ""
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence:
                fence = ""
        elif opened:
            fence = opened.group(1)
        else:
            yield number, line


def _bare(word: str) -> str:
    """The path in a word of a code span: the value of a ``NAME=value`` word, without the punctuation
    around it, a leading ``./``, an ``#anchor``, or a ``:LINE`` / ``::test_name`` / ``:Class`` suffix
    (no path here holds a colon)."""
    word = word.rsplit("=", 1)[-1].lstrip("\"'([").rstrip("\"')],;.").removeprefix("./")
    return word.split("#", 1)[0].split(":", 1)[0].rstrip(".,;")


def _resolve(folder: PurePosixPath, target: str) -> str | None:
    """``target``, relative to ``folder`` (or to the root if it starts with ``/``), as a path from the
    root; None where it climbs out of the repository."""
    parts = [] if target.startswith("/") else list(folder.parts)
    for part in target.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def test_every_path_the_docs_cite_exists() -> None:
    repository = this_repository()
    missing = [
        line
        for document in documents()
        for line in missing_citations(document, (ROOT / document).read_text(encoding="utf-8"), repository)
    ]
    assert missing == [], f"{len(missing)} citations of paths not in the repository:\n" + "\n".join(missing)


def test_the_pages_the_readme_and_the_templates_readme_are_checked() -> None:
    checked = set(documents())
    assert {"README.md", "docs/index.md", "docs/plugins/events.md", "templates/stream-plugin/README.md.mako"} <= checked
    assert not any(name.startswith((".venv/", "site/")) for name in checked)


def test_a_missing_path_is_reported_with_its_line_and_the_rest_is_not() -> None:
    repository = Repository(frozenset({"docs/guide.md", "docs/plugins/a.md", "framework/core.py", ".ci/run"}))
    text = "\n".join(
        [
            "The core is `framework/core.py:12` (`framework/core.py::test_it`), see `framework/gone.py`.",
            "Run `uv run python framework/old.py -x`, `bash .ci/run`, `docs/plugins/*.md`, `MYPYPATH=framework/typo`.",
            "A plugin's folder, `framework/<name>/`, and `${package}/rows.py`: placeholders.",
            "What you create: `.factstream/demo/summary.json`, `site/`; elsewhere: `../shared/tool.sh`.",
            "```sh",
            "cat framework/in_a_fence.py",
            "```",
            "A [page](a.md#top), [the guide](../guide.md), [a missing one](b.md), [away](../../../x.md).",
            "[Another site](https://example.org/framework/x.py), [here](#anchor), `docs/*/nope.md`, [a",
            "link over two lines](../gone.md).",
            "[ref]: ../../framework/core.py",
        ]
    )
    assert missing_citations("docs/plugins/page.md", text, repository) == [
        "docs/plugins/page.md:1 cites framework/gone.py, which does not exist",
        "docs/plugins/page.md:2 cites framework/old.py, which does not exist",
        "docs/plugins/page.md:2 cites framework/typo, which does not exist",
        "docs/plugins/page.md:4 cites ../shared/tool.sh, which does not exist (docs/shared/tool.sh)",
        "docs/plugins/page.md:8 cites b.md, which does not exist (docs/plugins/b.md)",
        "docs/plugins/page.md:8 cites ../../../x.md, which is outside the repository",
        "docs/plugins/page.md:9 cites docs/*/nope.md, which does not exist",
        "docs/plugins/page.md:10 cites ../gone.md, which does not exist (docs/gone.md)",
    ]
