from pathlib import Path

LICENSE = Path("/usr/share/common-licenses/Apache-2.0")


def verify(workspace):
    """1.0 when count.txt holds the number of words in the license."""
    words = len(LICENSE.read_text().split())
    try:
        return 1.0 if int((workspace / "count.txt").read_text()) == words else 0.0
    except (OSError, ValueError):
        return 0.0
