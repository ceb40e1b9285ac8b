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


# The autotuner (quanta/runtime/tuner.py) measures GEMM blockings at session creation and
# writes a user cache: off in the suite (every candidate gives the same bytes, which
# tests/runtime/test_tuner.py checks, so tuning changes no result), whose sessions are
# small and many; test_tuner.py turns it on with a cache folder of its own.
import os  # noqa: E402

os.environ.setdefault("QUANTA_TUNE", "0")
