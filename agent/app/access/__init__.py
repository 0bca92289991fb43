"""Who may use the worker's endpoints: key and session tokens, origins, per-address limits, TLS.

``guard.install_access_control`` puts all of it on the aiohttp app as one middleware,
so no route handler needs to know about it.
"""
