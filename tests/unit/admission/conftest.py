"""Make the shared admission test helpers (tests/fixtures/admission) importable."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "fixtures" / "admission"))
