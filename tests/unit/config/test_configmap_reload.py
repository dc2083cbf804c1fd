"""Live reload from a Kubernetes ConfigMap volume (deploy/): the kubelet never edits a mounted
file. It writes the new content into a fresh timestamped directory, points a `..data_tmp`
symlink at it, renames that over `..data` (one atomic step), then removes the old
directory; each file the pod sees is a symlink `name -> ..data/name` that never changes. The
watcher must see the content change through the unchanged symlink, and the proxy must run
the new quotas, exactly as after an editor's save."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from kqp.config import ConfigFiles
from kqp.proxy.app import ProxyApp, load_serve_setup
from kqp.quotas import QuotaEngine

LISTENER = 'upstream: {bootstrap_servers: ["kafka:9092"]}\nproxy: {bind_host: 0.0.0.0}\n'


def quotas(producer_byte_rate: int) -> str:
    return f"""quotas:
  entries:
    - entity: {{client-id: "<default>"}}
      producer_byte_rate: {producer_byte_rate}
"""


def produce_rates(app: ProxyApp) -> list[float]:
    assert app.engine is not None
    return [entry.limits["producer_byte_rate"] for entry in app.engine.settings.entries]


class ConfigMapVolume:
    """A directory laid out and updated as the kubelet's atomic writer does it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir()

    def write(self, files: dict[str, str]) -> None:
        self.generation += 1
        previous = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        data_dir = self.root / f"..2026_11_27_03_00_{self.generation:02d}.{1000 + self.generation}"
        data_dir.mkdir()
        for name, text in files.items():
            (data_dir / name).write_text(text)
        staging = self.root / "..data_tmp"
        staging.symlink_to(data_dir.name)
        os.replace(staging, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if previous is not None:
            shutil.rmtree(previous)


def test_a_configmap_update_is_seen_and_applied(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "quotas")
    volume.write({"quotas.yaml": quotas(1_000_000)})
    listener = tmp_path / "listener.yaml"
    listener.write_text(LISTENER)
    quota_file = volume.root / "quotas.yaml"
    setup = load_serve_setup([str(listener), str(quota_file)])
    assert setup is not None and setup.files is not None
    app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                   files=setup.files)
    assert app.engine is not None
    assert produce_rates(app) == [1_000_000]
    assert not setup.files.changed()

    volume.write({"quotas.yaml": quotas(2_000_000)})
    assert quota_file.is_symlink() and os.readlink(quota_file) == "..data/quotas.yaml"  # the path never changed
    assert setup.files.changed()
    assert app.reload("config file changed")
    assert produce_rates(app) == [2_000_000]
    assert not setup.files.changed()

    # An update with a mistake in it is rejected; the running quotas stay.
    volume.write({"quotas.yaml": quotas(-5)})
    assert setup.files.changed()
    assert not app.reload("config file changed")
    assert produce_rates(app) == [2_000_000]


def test_the_same_content_rewritten_is_no_change(tmp_path: Path) -> None:
    # The kubelet rewrites every file of the volume when any key changes; an unchanged file
    # (new inode, same bytes) must not count as a change.
    volume = ConfigMapVolume(tmp_path / "config")
    volume.write({"a.yaml": LISTENER, "b.yaml": quotas(1)})
    files = ConfigFiles([volume.root / "a.yaml"])
    volume.write({"a.yaml": LISTENER, "b.yaml": quotas(2)})
    assert not files.changed()


async def test_reload_runs_inside_the_event_loop_too(tmp_path: Path) -> None:
    # ProxyApp is built inside the running loop in `kqp serve`; the same reload path there.
    volume = ConfigMapVolume(tmp_path / "quotas")
    volume.write({"quotas.yaml": quotas(1_000_000)})
    listener = tmp_path / "listener.yaml"
    listener.write_text(LISTENER)
    setup = load_serve_setup([str(listener), str(volume.root / "quotas.yaml")])
    assert setup is not None
    app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                   files=setup.files)
    volume.write({"quotas.yaml": quotas(3_000_000)})
    await asyncio.sleep(0)
    assert setup.files is not None and setup.files.changed()
    assert app.reload("config file changed")
    assert app.engine is not None
    assert produce_rates(app) == [3_000_000]
