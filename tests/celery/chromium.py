"""A real headless Chromium for the browser tests (Debian's chromium + chromedriver, through
selenium): the test skips when either is missing (``.ci/run`` installs both)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def headless_chromium() -> Any:
    """A started browser (``quit()`` it after use), or the test skipped."""
    webdriver = pytest.importorskip("selenium.webdriver")
    chrome_service = pytest.importorskip("selenium.webdriver.chrome.service")
    if CHROMEDRIVER is None or CHROMIUM is None:
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=chrome_service.Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver
