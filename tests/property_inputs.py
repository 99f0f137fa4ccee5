"""What the property (hypothesis) tests of every input surface generate, and how many
examples they try (tests/test_properties.py, tests/test_option_properties.py).

Derandomized: the same examples on every run, so a failure in CI reproduces and never blocks
an unrelated change at random. LOOPSWEB_PROPERTY_SEARCH=N searches N random examples per test
instead (locally, to look further).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_SEARCH = int(os.environ.get("LOOPSWEB_PROPERTY_SEARCH") or 0)
PROPERTY_SETTINGS = settings(
    max_examples=_SEARCH or 100,
    derandomize=not _SEARCH,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text a user can type: anything but surrogates (not encodable) ...
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
# ... and NUL, which the OS never puts in argv but an HTTP query can carry.
ARG_TEXT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(
        ["0", "1", "2", "100000", "100001", "9" * 5000, "1.5", "1e9", " 3 ", "-0", "²"]
    ),
)
VALUES = st.one_of(ARG_TEXT, NUMBERS)
