"""The suite's own Java programs (tests/integration/java), compiled once per pytest process.

Each is a single-file program, and `java Program.java` (the JDK's source launch) would compile
it in memory again at every launch before running it: about 15 launches in the real-time line
(FeatureClients, with Kafka Streams among its imports, most of them), each paying the compiler
where nothing is measured, and the three Java consumers of the fleet's test compiling at once on
a busy host. javac compiles all of them once into a directory that lives as long as the pytest
process; every launch then runs the compiled class, the same code. (The bench's system test
still runs ConsumeRate.java as a source program, once per shape.)
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

JAVA_DIR = Path(__file__).parents[1] / "java"

_lock = threading.Lock()
_compiled: dict[Path, Path] = {}


def compiled_classes(kafka_dir: Path) -> Path:
    """The directory of the compiled programs against `kafka_dir`'s jars, compiled on first use."""
    with _lock:
        if kafka_dir not in _compiled:
            target = Path(tempfile.mkdtemp(prefix="kqp-java-programs-"))
            atexit.register(shutil.rmtree, target, True)
            result = subprocess.run(
                ["javac", "-nowarn", "-cp", f"{kafka_dir / 'libs'}/*", "-d", str(target),
                 *(str(source) for source in sorted(JAVA_DIR.glob("*.java")))],
                capture_output=True, text=True, timeout=300, check=False)
            if result.returncode != 0:
                raise RuntimeError(f"javac of {JAVA_DIR} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
            _compiled[kafka_dir] = target
        return _compiled[kafka_dir]


def java_program(kafka_dir: Path, program: str, *args: str, jvm_options: tuple[str, ...] = ()) -> list[str]:
    """The command that runs `program` (a class of tests/integration/java) with `args`, Kafka's
    jars on its class path."""
    classpath = f"{compiled_classes(kafka_dir)}:{kafka_dir / 'libs'}/*"
    return ["java", *jvm_options, "-cp", classpath, program, *args]
