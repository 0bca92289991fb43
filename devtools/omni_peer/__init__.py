"""The real vLLM-Omni 0.30.0 duplex server as a test peer, with only its GPU stage engines scripted.

Runs in its own venv (``make omni-venv`` builds ``.venv-omni``): ``.venv-omni/bin/python -m
devtools.omni_peer --port P``. Nothing of vLLM-Omni lives in this repository; the launcher
imports it from that venv and replaces only what talks to the stage engine cores.
"""
