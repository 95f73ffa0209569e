"""Property tests run twice over: a quick run in `make unit`, the full one in `make test`.

A test takes `examples` from `@pytest.mark.parametrize("examples", examples(FULL))` and
hands it to the `@settings` of a `@given` function it defines and calls.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Enough to exercise every branch the strategies reach often; `make test` runs the rest.
QUICK_EXAMPLES = 40


def examples(full: int) -> list[Any]:
    """The two runs of a property test: `quick` and `full` (marked slow)."""
    return [
        pytest.param(QUICK_EXAMPLES, id="quick"),
        pytest.param(full, id="full", marks=pytest.mark.slow),
    ]
