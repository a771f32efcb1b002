"""scripts/install.sh's check that a folder has room, which the install and test scripts run before their long work."""

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _require_free_mb(folder: Path, megabytes: int) -> subprocess.CompletedProcess:
    # the function alone, read out of the script: sourcing the whole script would install
    function = subprocess.run(
        ["sed", "-n", "/^require_free_mb()/,/^}/p", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True
    ).stdout
    script = f'{function}\nrequire_free_mb "$1" "$2" "the test files"\necho went on'
    return subprocess.run(["bash", "-c", script, "-", str(folder), str(megabytes)], capture_output=True, text=True)


def test_a_folder_with_room_goes_on(tmp_path):
    result = _require_free_mb(tmp_path, 1)
    assert (result.returncode, result.stdout, result.stderr) == (0, "went on\n", "")


def test_a_folder_without_room_stops_naming_it_its_free_space_and_the_need(tmp_path):
    result = _require_free_mb(tmp_path, 10**9)
    assert result.returncode == 1 and result.stdout == ""
    match = re.fullmatch(
        rf"error: {re.escape(str(tmp_path))} has (\d+) MB free; about 1000000000 MB are needed for the test files\. "
        r"Free some space there and run this again\.\n",
        result.stderr,
    )
    assert match, result.stderr
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    assert abs(int(match.group(1)) - free_mb) <= max(64, 0.05 * free_mb)  # other processes write meanwhile
