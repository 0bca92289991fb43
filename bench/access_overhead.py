"""What access control costs per request, A/B in one process.

a. the checks alone: verifying a session token, comparing the key, the origin check,
   a per-address admission (admit + release);
b. HTTP round trips on loopback to ``GET /healthz`` (aiohttp client, keep-alive): the
   app without a key against the same app with a key (Bearer key), interleaved so that
   machine load falls on both alike (a token costs what a. says on top);
c. refusing: a 401 for a wrong key and a 429 for an address over its rate, next to an
   allowed request.

Run: python -m bench.access_overhead [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time

from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from bench.stats import summary
from duplex_agent.agent.app.access.credentials import AccessKeys, Credential
from duplex_agent.agent.app.access.limits import AddressLimits
from duplex_agent.agent.app.access.origins import OriginPolicy
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import ScriptedPlugin


def per_call_us(fn, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def checks(count: int) -> None:
    key = secrets.token_urlsafe(24)
    keys = AccessKeys(key)
    token = Credential(keys.mint()[0])
    request = make_mocked_request("GET", "/v1/realtime", headers={"Host": "h:1", "Origin": "http://h:1"})
    origins = OriginPolicy("https://app.example")
    limits = AddressLimits(per_minute=0, open_per_address=4)
    print("a. the checks alone (µs per call):")
    print("   token verification:  " + summary(per_call_us(lambda: keys.check(token), count), "µs", digits=2))
    print("   key comparison:      " + summary(per_call_us(lambda: keys.check(Credential(key)), count), "µs", digits=2))
    print("   origin check:        " + summary(per_call_us(lambda: origins.check(request), count), "µs", digits=2))
    print("   admit + release:     " + summary(per_call_us(lambda: limits.admit("a").release(), count), "µs",
                                               digits=2))


async def round_trips(count: int) -> None:
    key = secrets.token_urlsafe(24)
    plugin = ScriptedPlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    open_app = build_app(backend, Settings(), with_webrtc=False)
    keyed_app = build_app(backend, Settings(api_key=key, sessions_per_minute=5), with_webrtc=False)
    clients = [TestClient(TestServer(open_app, host="127.0.0.1")), TestClient(TestServer(keyed_app, host="127.0.0.1"))]
    for client in clients:
        await client.start_server()
    plain, keyed = clients
    cases = {
        "no key configured": (plain, {}, 200),
        "key configured, Bearer key": (keyed, {"Authorization": f"Bearer {key}"}, 200),
        "wrong key -> 401": (keyed, {"Authorization": "Bearer nope"}, 401),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(count):
            for name, (client, headers, status) in cases.items():
                start = time.perf_counter()
                response = await client.get("/healthz", headers=headers)
                await response.read()
                samples[name].append((time.perf_counter() - start) * 1000)
                assert response.status == status, (name, response.status)
        print(f"b./c. GET /healthz round trips on loopback, interleaved (ms), {count} each:")
        for name, values in samples.items():
            print(f"   {name:<30} " + summary(values, "ms", digits=3))
        refused = []
        for _ in range(count):  # the keyed app allows 5 sessions a minute: the rest are 429s
            start = time.perf_counter()
            response = await keyed.get("/v1/realtime?duplex=1", headers={"Authorization": f"Bearer {key}",
                                                                         "Upgrade": "websocket", "Connection": "Upgrade",
                                                                         "Sec-WebSocket-Version": "13",
                                                                         "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
            await response.read()
            if response.status == 429:
                refused.append((time.perf_counter() - start) * 1000)
        print(f"   {'over the rate -> 429':<30} " + summary(refused, "ms", digits=3))
    finally:
        for client in clients:
            await client.close()
        await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()
    checks(2000 if args.quick else 20000)
    asyncio.run(round_trips(100 if args.quick else 1000))


if __name__ == "__main__":
    main()
