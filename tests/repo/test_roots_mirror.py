"""The test roots come from the mirror this machine's apt sources name (tests/support/roots.py)."""

from tests.support.roots import apt_mirror


def test_deb822_sources_give_the_main_archive(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\n# a comment: ignored\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n")
    assert apt_mirror(tmp_path) == "http://mirror.example/debian"


def test_one_line_sources_with_options(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://archive.example/debian bookworm main\n")
    assert apt_mirror(tmp_path) == "http://archive.example/debian"


def test_no_sources_is_none(tmp_path):
    assert apt_mirror(tmp_path) is None
