"""The pieces alone: session tokens, the origin policy, the per-address limiter, settings secrets."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from duplex_agent.agent.app.access.credentials import AccessDenied, AccessKeys, Credential
from duplex_agent.agent.app.access.limits import AddressLimits, LimitExceeded
from duplex_agent.agent.app.access.origins import OriginPolicy, OriginRejected
from duplex_agent.agent.app.settings import Settings
from tests.security.conftest import new_key


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_token_lives_exactly_its_ttl():
    clock = Clock()
    keys = AccessKeys(new_key(), clock=clock)
    token, expires = keys.mint(30)
    assert expires == 1030
    keys.check(Credential(token))
    clock.now = 1029.5
    keys.check(Credential(token))
    clock.now = 1030
    with pytest.raises(AccessDenied, match="expired"):
        keys.check(Credential(token))


def test_a_tampered_token_or_another_key_s_token_is_refused():
    key = new_key()
    keys = AccessKeys(key)
    token, _ = keys.mint()
    prefix, expiry, nonce, signature = token.split(".")
    longer = f"{prefix}.{int(expiry) + 10**6}.{nonce}.{signature}"
    for bad in (longer, AccessKeys(new_key()).mint()[0], token[:-2] + "xx"):
        with pytest.raises(AccessDenied, match="signature"):
            keys.check(Credential(bad))
    with pytest.raises(AccessDenied, match="needs the API key"):
        keys.check(Credential(token), key_only=True)
    keys.check(Credential(key), key_only=True)
    with pytest.raises(ValueError):
        keys.mint(0)


def _request(origin: str | None, host: str = "192.0.2.2:8443"):
    headers = {"Host": host}
    if origin is not None:
        headers["Origin"] = origin
    return make_mocked_request("GET", "/v1/realtime", headers=headers)


def test_same_origin_by_default_plus_an_allow_list():
    policy = OriginPolicy("https://App.Example, http://localhost:3000")
    policy.check(_request(None))  # a program, not a page
    policy.check(_request("https://192.0.2.2:8443"))
    policy.check(_request("https://app.example"))
    policy.check(_request("http://localhost:3000"))
    for origin in ("https://192.0.2.2:9999", "https://evil.example", "null", "http://localhost:3001"):
        with pytest.raises(OriginRejected):
            policy.check(_request(origin))
    OriginPolicy("*").check(_request("https://anything.example"))


def test_the_rate_window_slides_and_says_when_to_retry():
    clock = Clock()
    limits = AddressLimits(per_minute=3, open_per_address=0, clock=clock)
    for second in range(3):
        clock.now = 1000 + second * 10
        limits.admit("a").release()
    with pytest.raises(LimitExceeded) as over:
        limits.admit("a")
    assert over.value.retry_after_s == 40  # the first start leaves the window at 1060
    limits.admit("b").release()  # another address is not affected
    clock.now = 1060.5
    limits.admit("a").release()


def test_open_slots_and_records_are_released():
    clock = Clock()
    limits = AddressLimits(per_minute=0, open_per_address=2, clock=clock)
    first, second = limits.admit("a"), limits.admit("a")
    with pytest.raises(LimitExceeded):
        limits.admit("a")
    alive = {"peer": True}
    second.hand_over(lambda: alive["peer"])
    first.release()
    first.release()  # idempotent
    third = limits.admit("a")
    alive["peer"] = False  # the peer left its registry
    assert limits.open_count("a") == 1
    third.release()
    assert limits.tracked_addresses() == 0


def test_secrets_stay_out_of_repr_and_come_from_env_or_a_file(tmp_path):
    key = new_key()
    settings = Settings.from_env({"DUPLEX_API_KEY": key, "LIVEKIT_API_SECRET": key + "lk",
                                  "DUPLEX_BACKEND_API_KEY": key + "b", "DUPLEX_OPENAI_API_KEY": key + "o"})
    assert settings.resolved_api_key() == key
    assert key not in repr(settings)
    path = tmp_path / "key"
    path.write_text(key + "\n")
    assert Settings(api_key_file=str(path)).resolved_api_key() == key
    assert Settings.from_env({"DUPLEX_TLS_SELF_SIGNED": "true"}).tls_self_signed is True
