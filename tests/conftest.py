"""Test configuration shared by every test.

Hypothesis profiles: "ci" (default; derandomized, bounded examples, no deadline since
the machine is shared and noisy) and "dev" (more examples, random). Select with
``pytest --hypothesis-profile=dev``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile("ci")

import pytest  # noqa: E402  (appended section: the pass manager's test mode)


@pytest.fixture(autouse=True, scope="session")
def _verify_after_every_pass():
    """The pass manager verifies the graph after every pass in every test (its debug
    mode); a manager created with ``verify=False`` opts out explicitly."""
    from quanta.passes.manager import set_verify_default

    set_verify_default(True)
    yield
    set_verify_default(False)
