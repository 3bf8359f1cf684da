"""The docs tooling (docs/tools/) is a folder of scripts, not a package: its modules are imported from there."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "docs" / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
