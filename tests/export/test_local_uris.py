"""A local output directory's URI and back: the driver's checks (Hadoop), pyarrow's writes and the
up-to-date check must all name the same directory, whatever characters its name holds."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from factstream.export.output import local_path, local_uri

NAMES = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(st.lists(NAMES.filter(lambda n: n not in (".", "..")), min_size=1, max_size=3))
def test_local_path_reads_back_the_directory_local_uri_names(parts: list[str]) -> None:
    directory = Path("/srv", *parts)
    uri = local_uri(directory)
    assert uri == "file://" + directory.as_posix()  # as Hadoop's Path takes it: nothing escaped
    assert local_path(uri) == directory


def test_local_path_takes_the_path_literally_and_only_of_file_uris() -> None:
    assert local_path("file:///data/my exports [1]/%41#x") == Path("/data/my exports [1]/%41#x")
    assert local_path("file:/data/out") == Path("/data/out")
    assert local_path("file://host/data/out") == Path("/data/out")
    assert local_path("s3a://bucket/out") is None
    assert local_path("/data/out") is None
