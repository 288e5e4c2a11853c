"""A profile database that cannot be used is one paragraph naming CV_DATABASE_URL, password masked."""

from __future__ import annotations

import pytest

from clairvoyant.profiler.persistence import DatabaseUnavailable, ProfileRepository
from clairvoyant.stack.natsserver import free_port


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "shown", "cause"),
    [
        (
            "postgresql://cv:hunter22@127.0.0.1:{port}/cv",
            "postgresql://cv:***@127.0.0.1:{port}/cv",
            "Connection refused",
        ),
        ("garbage", "garbage", "Could not parse SQLAlchemy URL from given URL string"),
        ("mysql://cv:hunter22@127.0.0.1/cv", "mysql://cv:***@127.0.0.1/cv", "No module named"),
    ],
)
def test_an_unusable_database_url_is_named_and_masked(url: str, shown: str, cause: str) -> None:
    port = free_port()
    with pytest.raises(DatabaseUnavailable) as failed:
        ProfileRepository(url.format(port=port))
    message = str(failed.value)
    assert message.startswith(f"cannot use the profile database CV_DATABASE_URL={shown.format(port=port)}: ")
    assert cause in message and "hunter22" not in message and "\n" not in message
