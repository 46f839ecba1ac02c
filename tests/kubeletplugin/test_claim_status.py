"""The claim status writer against the API emulator; tests/cluster runs the same scenario
against a real kube-apiserver, which is the judge of what the emulator must do."""
from tests.support.claimstatus import check_status_writer


def test_status_entries_are_ours_alone_and_go_at_unprepare(emulator):
    check_status_writer(emulator.api_client())
