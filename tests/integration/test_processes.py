"""Leftover embedded servers are found by pid file and stopped, and nothing else ever is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mnemesh.processes import DataFolderBusy, data_folder_lock, reap_leftover, write_pidfile

pytestmark = pytest.mark.integration


def test_a_leftover_recorded_in_its_pid_file_is_stopped(tmp_path: Path) -> None:
    leftover = subprocess.Popen(["sleep", "300"])
    pidfile = tmp_path / "redis.pid"
    write_pidfile(pidfile, leftover.pid)
    assert reap_leftover(pidfile) == leftover.pid
    assert leftover.wait(5) is not None and not pidfile.exists()


def test_a_pid_file_whose_pid_now_belongs_to_another_process_stops_nothing(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        pidfile = tmp_path / "postgres.pid"
        pidfile.write_text(f"{bystander.pid} 1\n")  # the recorded start time is not the bystander's
        assert reap_leftover(pidfile) is None
        assert bystander.poll() is None and not pidfile.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_one_data_folder_serves_one_run_at_a_time(tmp_path: Path) -> None:
    with data_folder_lock(tmp_path):
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from mnemesh.processes import data_folder_lock\n"
             "try:\n    data_folder_lock(Path(sys.argv[1])).__enter__()\nexcept Exception as e:\n"
             "    print(type(e).__name__, e); sys.exit(3)", str(tmp_path)],
            capture_output=True, text=True, timeout=30)
    assert probe.returncode == 3 and DataFolderBusy.__name__ in probe.stdout and "MNEMESH_DATA_DIR" in probe.stdout
