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
# .ci/isa_check.sh runs the kernel tests under QEMU's instruction-set emulator, tens of
# times slower than the host: a few derandomized examples a property reach every kernel
# path there, and the host's own run has already covered the example space.
settings.register_profile("isa", settings.get_profile("ci"), max_examples=4)
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


# ``--param-sample=N`` keeps, of each test function's parametrizations, the first and
# every N-th after it (collection order, so the same items every run): every test
# function still runs once. .ci/isa_check.sh uses it to fit the kernel tests into
# QEMU's emulated CPU, where the full parametrized space would take most of an hour; the
# host's own run of the suite covers the whole space.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--param-sample",
        type=int,
        default=1,
        metavar="N",
        help="keep every N-th parametrization of each test function (the first always)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = config.getoption("--param-sample")
    if every <= 1:
        return
    seen: dict[str, int] = {}
    kept, dropped = [], []
    for item in items:
        key = item.nodeid.split("[", 1)[0]
        index = seen.get(key, 0)
        seen[key] = index + 1
        (kept if index % every == 0 else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
