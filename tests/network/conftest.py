import pytest

from devtools.netem import unavailable_reason


@pytest.fixture(autouse=True)
def _namespaces_available() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"impaired-network tests need namespaces and TUN devices: {reason}")
