"""The type of the `start_proxy` fixture (tests/integration/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from harness.proxy_process import ProxyProcess

ProxyFactory = Callable[..., ProxyProcess]
