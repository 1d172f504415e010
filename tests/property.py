"""How many examples the property tests (hypothesis) try.

``make test`` runs each at its base count, derandomized, so a run is repeatable and the
suite stays well under 30 minutes. ``make fuzz`` sets ``FLEETCARE_PROPERTY_SCALE`` (10 by
default there): every property test then tries that many times its base count, with
fresh randomness, for a deeper search than a test run affords.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("FLEETCARE_PROPERTY_SCALE", "1"))
DERANDOMIZE = "FLEETCARE_PROPERTY_SCALE" not in os.environ


def examples(base: int) -> int:
    """``base`` examples for ``make test``; scaled for ``make fuzz``."""
    return max(1, round(base * SCALE))
