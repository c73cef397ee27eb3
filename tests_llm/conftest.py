"""`make test-llm`: the agent loop against a real small model (not part of `make test`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))  # the unit tests' fakes
