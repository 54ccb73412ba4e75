"""test_verdicts.py's comparison over the rest of the corpus: the sibling heads' checkpoints
(tests/checks/test_sibling_heads.py) and the release differences' (release_rows.py). PENDING is test_verdicts.py's.
"""

from __future__ import annotations

import pytest

from .support import Case
from .test_verdicts import OTHER_CASES, agrees, as_recorded


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c.name for c in OTHER_CASES])
def test_validate_agrees_with_the_release(release, built, outcomes, request, case: Case):
    agrees(release, built, outcomes, request, case)


def test_each_release_does_what_is_recorded(release, built, outcomes):
    as_recorded(release, built, outcomes, OTHER_CASES)
