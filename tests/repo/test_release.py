"""The version in one place (pyproject.toml) and everything that carries it: the package, the
chart, CHANGELOG.md and docs/upgrading.md. (The image's tag: tests/cluster/test_upgrade.py loads
`make image`'s archive and runs it.)"""

import re
import subprocess
import sys

import yaml

from tests.support import REPO
from tests.support.release import releases, version

CHART = REPO / "deploy" / "helm" / "gpushare-dra" / "Chart.yaml"


def semver(text: str) -> tuple[int, ...]:
    assert re.fullmatch(r"\d+\.\d+\.\d+", text), f"not MAJOR.MINOR.PATCH: {text!r}"
    return tuple(int(p) for p in text.split("."))


def test_the_package_and_the_cli_say_pyprojects_version():
    import dra_driver

    assert dra_driver.__version__ == version(), (
        f"the installed metadata says {dra_driver.__version__}, pyproject.toml {version()}: "
        "reinstall the package (make lint does: pip install -e '.[test]')")
    out = subprocess.run([sys.executable, "-m", "dra_driver.cli", "--version"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.stdout.startswith(f"gpushare-dra {version()} (Python "), out


def test_the_charts_version_and_app_version_are_the_release():
    chart = yaml.safe_load(CHART.read_text())
    assert (chart["version"], chart["appVersion"]) == (version(), version()), chart


def test_the_changelog_has_unreleased_then_each_release_newest_first_with_its_commit():
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert headings[0] == ("Unreleased", ""), headings
    released = [v for v, _ in headings[1:]]
    assert released and all(date for _, date in headings[1:]), headings
    assert sorted(released, key=semver, reverse=True) == released, released
    # Each release links its commit (the upgrade test builds the previous one from it).
    assert list(releases()) == released, (list(releases()), released)
    for commit in releases().values():
        kind = subprocess.run(["git", "cat-file", "-t", commit], cwd=REPO, capture_output=True, text=True)
        assert kind.stdout.strip() == "commit", (commit, kind.stderr)
    # The working tree is the newest release, or what comes after it.
    assert semver(version()) >= semver(released[0]), (version(), released[0])
    if version() != released[0]:
        assert f"What goes into {version()}" in text


def test_upgrading_has_notes_for_each_release_and_the_coming_one():
    text = (REPO / "docs" / "upgrading.md").read_text()
    sections = re.findall(r"^## (?:(\d+\.\d+\.\d+) to )?(\d+\.\d+\.\d+)$", text, re.M)
    targets = [to for _, to in sections]
    assert targets[0] == version(), sections
    assert set(releases()) <= set(targets), (set(releases()), targets)
    for older, newer in sections:
        if older:
            assert semver(older) < semver(newer), (older, newer)
