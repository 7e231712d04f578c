"""A real headless chromium for the tests that look at pages (the history UI in the deployment test,
the documentation site's search): Debian's chromium and chromedriver, which ``make install``
(system-tools) installs."""

from __future__ import annotations

import shutil
from typing import Any


def headless_chromium(*arguments: str) -> Any:
    """A selenium ``Chrome`` driving headless chromium, with ``arguments`` added (window size, ...);
    the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromedriver = shutil.which("chromedriver")
    assert chromedriver, "chromedriver is missing: make install (system-tools) installs Debian's chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *arguments):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=options)
