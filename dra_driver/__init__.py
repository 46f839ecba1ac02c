"""gpushare-dra: the cluster side and shared base of the driver (docs/interfaces.md)."""

from importlib.metadata import PackageNotFoundError, version

# The version is written in one place, pyproject.toml; the installed package's metadata carries
# it here, to `gpushare-dra --version`, the image's tag (hack/cluster/image) and the chart's
# appVersion (tests/repo/test_release.py holds them equal). CHANGELOG.md says what each changed.
try:
    __version__ = version("gpushare-dra")
except PackageNotFoundError:
    __version__ = "unknown (not installed; run from a source tree)"
