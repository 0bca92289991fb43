"""Headless Chromium driven by selenium, with a WAV file as its microphone.

Selenium calls block: run them in a thread (``asyncio.to_thread``) when the
server under test lives on the test's event loop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

os.environ.setdefault("SE_OFFLINE", "true")  # selenium must never fetch drivers


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is not installed"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


class Browser:
    """One headless Chromium with its own throwaway profile."""

    def __init__(self, *, fake_mic_wav: Path | None = None, allow_microphone: bool = True,
                 extra_args: tuple[str, ...] = ()) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self._profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in (
            "--headless=new", "--no-sandbox", "--disable-background-networking", "--disable-gpu",
            "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
            f"--user-data-dir={self._profile}", "--autoplay-policy=no-user-gesture-required",
            # Real host candidates instead of mDNS names: no multicast lookups leave the host.
            "--disable-features=WebRtcHideLocalIpsWithMdns",
            "--use-fake-device-for-media-stream",
        ):
            options.add_argument(arg)
        if allow_microphone:
            options.add_argument("--use-fake-ui-for-media-stream")
        else:
            options.add_argument("--deny-permission-prompts")
        if fake_mic_wav is not None:
            options.add_argument(f"--use-file-for-fake-audio-capture={fake_mic_wav}")
        for arg in extra_args:
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))

    def open(self, url: str) -> None:
        self.driver.get(url)

    def click(self, element_id: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.ID, element_id).click()

    def text(self, element_id: str) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id).text

    def wait_for_text(self, element_id: str, wanted: str, timeout: float = 10.0) -> str:
        """Wait until the element's text contains ``wanted``; returns the text."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(lambda _: wanted in self.text(element_id))
        except TimeoutException:
            shot = self.screenshot(f"failed-wait-for-{element_id}")
            raise AssertionError(f"#{element_id} never showed {wanted!r}; it shows {self.text(element_id)!r}; the "
                                 f"page's #error shows {self._text_if_any('error')!r} (screenshot: "
                                 f"artifacts/{shot.name})") from None
        return self.text(element_id)

    def _text_if_any(self, element_id: str) -> str | None:
        from selenium.common.exceptions import NoSuchElementException

        try:
            return self.text(element_id)
        except NoSuchElementException:
            return None

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)
