"""Lists the packages under the one name, duplex_agent (mapping in pyproject.toml)."""

from pathlib import Path

from setuptools import find_packages, setup

FOLDERS = ("agent", "plugins", "webrtc", "frontend", "livekit_agents")
#: Folders of files only: the page's livekit-client bundle, there once `make install` has copied it.
DATA_PACKAGES = [f"duplex_agent.{folder.replace('/', '.')}" for folder in ("frontend/vendor",)
                 if (Path(__file__).parent / folder).is_dir()]

setup(packages=["duplex_agent"] + [
    f"duplex_agent.{name}" for folder in FOLDERS for name in [folder, *(f"{folder}.{sub}" for sub in find_packages(folder))]
] + DATA_PACKAGES)
