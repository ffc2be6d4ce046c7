"""The engine tests' shared fixture: each random config with its one-by-one greedy tokens."""
import pytest

from serve_helpers import CONFIGS, reference_case


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request):
    """(cfg, params, prompts, greedy tokens one prompt at a time) for the module's NEW tokens."""
    return reference_case(request.param, request.module.NEW)
