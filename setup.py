"""Lists the packages under the one name, duplex_agent (mapping in pyproject.toml)."""

from setuptools import find_packages, setup

FOLDERS = ("agent", "plugins", "webrtc", "frontend", "livekit_agents")

setup(packages=["duplex_agent"] + [
    f"duplex_agent.{name}" for folder in FOLDERS for name in [folder, *(f"{folder}.{sub}" for sub in find_packages(folder))]
])
