"""A real headless browser for the web UI's tests: Debian's chromium, driven by Selenium through
Debian's chromedriver (never a downloaded browser: this machine cannot fetch one)."""
from __future__ import annotations

import base64
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DESKTOP = (1280, 900)
PHONE = (390, 844)


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"the browser tests need {' and '.join(missing)}: install Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; scripts/setup-dev.sh does when run as root)", pytrace=False)
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail("the browser tests need selenium: pip install -e '.[test]'", pytrace=False)


def chrome(width: int, height: int, authorization: str | None) -> Any:
    """A headless chromium of that window size; every request it sends carries AUTHORIZATION (an
    HTTP Authorization header value), as a browser that signed in with HTTP Basic does."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--window-size={width},{height}",
                "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    log = os.environ.get("KL_UI_CHROMEDRIVER_LOG")
    service = Service(executable_path=str(CHROMEDRIVER), log_output=log) if log else Service(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    if width < 500:
        # chromium's windows are at least 500 px wide: a phone's screen is emulated instead
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})
    if authorization:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": authorization}})
    return driver


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def console_problems(driver: Any) -> list[str]:
    """What the page logged at warning level or above (CSP violations and failed loads are errors)."""
    return [f"{e['level']}: {e['message']}" for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def screenshot(driver: Any, directory: Path, name: str) -> Path:
    """The whole page (not just the window) as DIRECTORY/NAME.png."""
    directory.mkdir(parents=True, exist_ok=True)
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path = directory / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def screenshot_dir(default: Path) -> Path:
    """$KL_UI_SCREENSHOTS when set (CI keeps it as an artifact), else DEFAULT (a pytest tmp dir)."""
    chosen = os.environ.get("KL_UI_SCREENSHOTS")
    path = Path(chosen) if chosen else default
    path.mkdir(parents=True, exist_ok=True)
    return path


def quit_quietly(driver: Any) -> None:
    from selenium.common.exceptions import WebDriverException

    # a browser that died already has nothing left to stop
    with contextlib.suppress(WebDriverException, OSError):
        driver.quit()


__all__ = ["DESKTOP", "PHONE", "basic", "chrome", "console_problems", "quit_quietly", "require_browser", "screenshot",
           "screenshot_dir"]
