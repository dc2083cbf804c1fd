"""A real Apache Kafka cluster on loopback, assembled from Maven Central jars.

KRaft, every node a combined broker + controller with a static quorum, each with PLAINTEXT,
SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, and OAUTHBEARER with Kafka's unsecured
JWT validator: any `sub` logs in, as in Kafka's development setup) and CONTROLLER listeners on free
ports. Readiness is an ApiVersions round trip on every node, not a fixed sleep; a node that
fails to start raises with the tail of its log. Used by the test suite and `make demo`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.certificates import SslMaterial

REPO = Path(__file__).resolve().parent.parent
KAFKA_VERSION = "4.3.1"
DEFAULT_KAFKA_DIR = REPO / ".cache" / f"kafka-{KAFKA_VERSION}"
USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}

_BROKER_LOG4J = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
"""
_TOOLS_LOG4J = """Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDERR
"""


class KafkaHarnessError(RuntimeError):
    pass


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def terminate(process: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    """SIGTERM a child that is still running, and SIGKILL it if it has not exited in time."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)


def kafka_cluster_id() -> str:
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """One ApiVersions v0 round trip: the broker answers only once it serves requests."""
    client_id = b"kqp-harness"
    request = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(request)) + request)
            header = recv_exact(sock, 4)
            payload = recv_exact(sock, struct.unpack(">i", header)[0])
            correlation_id, error_code = struct.unpack(">ih", payload[:6])
            return correlation_id == 1 and error_code == 0
    except OSError:
        return False


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes from a blocking socket (TLS sockets too); OSError if it closes first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


# How a short-lived JVM runs on a host shared with the tests (Kafka's tools, the suite's Java
# clients, the Spark tests' JVMs: tests/spark/helpers.py): the serial collector and the first JIT
# tier only, so that a run of seconds does not spend its CPU compiling hot code it will not run
# long enough to repay.
SHORT_RUN_JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
CLIENT_JVM_OPTIONS = (*SHORT_RUN_JVM_OPTIONS, "-Xshare:auto", "-Djava.awt.headless=true")


def java_command(kafka_dir: Path, main_class: str, *args: str, heap: str = "256m",
                 log_config: Path | None = None) -> list[str]:
    command = ["java", f"-Xmx{heap}", *CLIENT_JVM_OPTIONS]
    if log_config is not None:
        command.append(f"-Dlog4j2.configurationFile={log_config}")
    command += ["-cp", str(kafka_dir / "libs" / "*"), main_class, *args]
    return command


@dataclass
class KafkaNode:
    node_id: int
    plaintext_port: int
    sasl_port: int
    controller_port: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    ssl_port: int | None = None  # an SSL listener, when the cluster has SSL material
    # A RELAY listener (plaintext) on relay_port that advertises relay_advertised_port, where a
    # byte relay listens: clients that bootstrap through the relay stay on it without the relay
    # rewriting anything (the floor of a proxy hop, for bench/proxy_throughput.py).
    relay_port: int | None = None
    relay_advertised_port: int | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class KafkaCluster:
    def __init__(self, nodes: int = 1, workdir: Path | None = None, kafka_dir: Path = DEFAULT_KAFKA_DIR,
                 heap: str = "512m", extra_config: dict[str, str] | None = None,
                 ssl: SslMaterial | None = None, relay_listener: bool = False) -> None:
        if not (kafka_dir / "libs").is_dir():
            raise KafkaHarnessError(f"Kafka jars not found in {kafka_dir}/libs: run `make kafka` first")
        self.kafka_dir = kafka_dir
        self.heap = heap
        self.extra_config = extra_config or {}
        self.ssl = ssl
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="kqp-kafka-")) if workdir is None else workdir
        self.cluster_id = kafka_cluster_id()
        per_node = 4 if ssl is not None else 3
        ports = free_ports(per_node * nodes)
        relay_ports = free_ports(2 * nodes) if relay_listener else []
        self.nodes: dict[int, KafkaNode] = {}
        for index in range(nodes):
            node_id = index + 1
            node_dir = self.workdir / f"node-{node_id}"
            first = per_node * index
            self.nodes[node_id] = KafkaNode(
                node_id, ports[first], ports[first + 1], ports[first + 2],
                node_dir / "server.properties", node_dir / "broker.log",
                ssl_port=ports[first + 3] if ssl is not None else None,
                relay_port=relay_ports[2 * index] if relay_ports else None,
                relay_advertised_port=relay_ports[2 * index + 1] if relay_ports else None,
            )
        self.tools_log4j = self.workdir / "tools-log4j2.yaml"
        self.broker_log4j = self.workdir / "log4j2.yaml"

    # ---- addresses --------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.plaintext_port}" for n in self.nodes.values())

    @property
    def sasl_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.sasl_port}" for n in self.nodes.values())

    @property
    def ssl_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.ssl_port}" for n in self.nodes.values() if n.ssl_port is not None)

    @property
    def broker_ports(self) -> set[int]:
        return {p for n in self.nodes.values()
                for p in (n.plaintext_port, n.sasl_port, n.controller_port, n.ssl_port, n.relay_port)
                if p is not None}

    # ---- lifecycle --------------------------------------------------------------------

    def _write_config(self, node: KafkaNode) -> None:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        replication = min(3, len(self.nodes))
        users = " ".join(f'user_{name}="{password}"' for name, password in USERS.items())
        lines = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listeners": f"PLAINTEXT://127.0.0.1:{node.plaintext_port},SASL_PLAINTEXT://127.0.0.1:{node.sasl_port},"
                         f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.plaintext_port},"
                                    f"SASL_PLAINTEXT://127.0.0.1:{node.sasl_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            # No sasl.oauthbearer.jwks.endpoint.url and no server callback handler: the broker
            # validates with OAuthBearerUnsecuredValidatorCallbackHandler (unsigned JWTs, `sub`).
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "log.dirs": str(node.config.parent / "data"),
            "num.partitions": "1",
            "default.replication.factor": str(replication),
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": str(replication),
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": str(replication),
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": str(replication),
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.dedupe.buffer.size": "16777216",
            "auto.create.topics.enable": "true",
        }
        if self.ssl is not None and node.ssl_port is not None:
            lines["listeners"] += f",SSL://127.0.0.1:{node.ssl_port}"
            lines["advertised.listeners"] += f",SSL://127.0.0.1:{node.ssl_port}"
            lines["listener.security.protocol.map"] += ",SSL:SSL"
            lines.update({
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.ssl.broker.key_and_cert),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ssl.ca.cert),
                "ssl.client.auth": "required" if self.ssl.client_auth else "none",
            })
        if node.relay_port is not None:
            lines["listeners"] += f",RELAY://127.0.0.1:{node.relay_port}"
            lines["advertised.listeners"] += f",RELAY://127.0.0.1:{node.relay_advertised_port}"
            lines["listener.security.protocol.map"] += ",RELAY:PLAINTEXT"
        if len(self.nodes) > 1:
            # A quorum of three combined brokers and controllers sharing two cores with the
            # suite: Kafka's defaults hold the Raft leader to a follower's fetch within 2 s and
            # fence a broker 9 s after its last heartbeat, so a few seconds without CPU (the
            # controller logged events of 3-7 s in two fresh clones' `make test`, 2026-11-28)
            # set off elections and fenced brokers, and partitions went without a leader under
            # the test then running. Five times the fetch time-out and twice the session are
            # still seconds, so a broker a test kills is fenced and replaced as before, a few
            # seconds later.
            lines["controller.quorum.fetch.timeout.ms"] = "10000"
            lines["broker.session.timeout.ms"] = "18000"
        lines.update(self.extra_config)
        node.config.parent.mkdir(parents=True, exist_ok=True)
        node.config.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))

    def _format(self, node: KafkaNode) -> None:
        scram = []
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            for name, password in USERS.items():
                scram += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        result = subprocess.run(
            java_command(self.kafka_dir, "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                         "-c", str(node.config), "--ignore-formatted", *scram, log_config=self.tools_log4j),
            capture_output=True, timeout=120, check=False,
        )
        if result.returncode != 0:
            raise KafkaHarnessError(f"formatting node {node.node_id} failed:\n{result.stderr.decode()[-3000:]}")

    def _launch(self, node: KafkaNode) -> None:
        log = node.log.open("ab")
        node.process = subprocess.Popen(
            ["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
             "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={self.broker_log4j}",
             "-cp", str(self.kafka_dir / "libs" / "*"), "kafka.Kafka", str(node.config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()

    def start(self, timeout_s: float = 120.0) -> KafkaCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tools_log4j.write_text(_TOOLS_LOG4J)
        self.broker_log4j.write_text(_BROKER_LOG4J)
        try:
            for node in self.nodes.values():
                self._write_config(node)
            with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(self._format, self.nodes.values()))
            for node in self.nodes.values():
                self._launch(node)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = 120.0, node_ids: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(node_ids if node_ids is not None else self.nodes)
        while pending:
            for node_id in list(pending):
                node = self.nodes[node_id]
                if not node.running:
                    raise KafkaHarnessError(f"node {node_id} exited during start-up:\n{self.log_tail(node_id)}")
                if api_versions_ok("127.0.0.1", node.plaintext_port):
                    pending.discard(node_id)
            if pending and time.monotonic() > deadline:
                tails = "\n".join(self.log_tail(n) for n in pending)
                raise KafkaHarnessError(f"nodes {sorted(pending)} not ready after {timeout_s:.0f} s:\n{tails}")
            if pending:
                time.sleep(0.2)

    def log_tail(self, node_id: int, lines: int = 40) -> str:
        log = self.nodes[node_id].log
        if not log.exists():
            return f"(node {node_id}: no log)"
        return f"--- node {node_id} log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def kill_node(self, node_id: int) -> None:
        """Kill a broker abruptly (SIGKILL), as a crash would."""
        node = self.nodes[node_id]
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(timeout=30)

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> None:
        self._launch(self.nodes[node_id])
        self.wait_ready(timeout_s, [node_id])

    def settle_after_restart(self, timeout_s: float = 120.0) -> None:
        """Return once a restarted broker is back in every replica set and leads its partitions
        again, as before the kill.

        A broker answers ApiVersions (`start_node`) long before it has caught up: the next
        test on a shared cluster would otherwise start while the restarted broker copies every
        partition it follows, and while leadership still sits on the others until the
        controller's periodic rebalance (every 300 s by default) moves it back in the middle of
        whatever runs then. Both cost the CPU a real-time test needs, and the move fails its
        clients' requests with NOT_LEADER (a fresh clone's `make test`, 2026-11-28)."""
        from confluent_kafka import ElectionType  # type: ignore[attr-defined]
        from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})

        def in_sync() -> bool:
            metadata = admin.list_topics(timeout=10)
            return len(metadata.brokers) == len(self.nodes) and all(
                topic.error is None and all(p.leader >= 0 and len(p.isrs) == len(p.replicas)
                                            for p in topic.partitions.values())
                for topic in metadata.topics.values())

        deadline = time.monotonic() + timeout_s
        while not in_sync():
            if time.monotonic() > deadline:
                raise KafkaHarnessError(f"replicas not back in sync {timeout_s:.0f} s after a restart")
            time.sleep(0.5)
        # Each partition's preferred leader (the first replica) back in front; partitions whose
        # leader already is the preferred one answer ELECTION_NOT_NEEDED, which is no failure.
        # (No operation_timeout: confluent-kafka 2.16 raises SystemError on it.)
        admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=60)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM every node and wait for its controlled shutdown; `kill`: SIGKILL instead, for a
        cluster thrown away with its data, where nothing waits for a controlled shutdown (three
        combined brokers and controllers stopping at once took 5.45 s of it on a busy host)."""
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        for node in self.nodes.values():
            if node.process is None:
                continue
            try:
                node.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(timeout=10)
        if self._own_workdir and not os.environ.get("KQP_KEEP_KAFKA_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- tools ------------------------------------------------------------------------

    def run_tool(self, main_class: str, *args: str, timeout: float = 300.0, heap: str = "512m",
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(java_command(self.kafka_dir, main_class, *args, heap=heap,
                                             log_config=self.tools_log4j),
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise KafkaHarnessError(f"{main_class} {' '.join(args)} failed ({result.returncode}):\n"
                                    f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return result

    def topic_names(self, including: Iterable[str] = (), timeout_s: float = 30.0) -> set[str]:
        """The topics the cluster lists (Metadata, as kafka-topics --list asks it), asked in process
        with librdkafka's admin client rather than by starting kafka-topics' JVM (1.3-1.7 s on a
        busy host), once the listing holds every topic in `including`: a broker answers Metadata
        from its copy of the metadata log, which may trail a CreateTopics just answered by some
        milliseconds, a lag the JVM's start-up used to hide. A listing that holds a topic created
        in a request holds whatever else that request created."""
        from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        wanted = set(including)
        deadline = time.monotonic() + timeout_s
        while not wanted <= (names := set(admin.list_topics(timeout=10).topics)):
            if time.monotonic() > deadline:
                raise KafkaHarnessError(f"topics {sorted(wanted - names)} not listed after {timeout_s:.0f} s")
            time.sleep(0.05)
        return names

    def tool_command(self, main_class: str, *args: str, heap: str = "512m") -> list[str]:
        return java_command(self.kafka_dir, main_class, *args, heap=heap, log_config=self.tools_log4j)

    def create_topic(self, topic: str, partitions: int = 1, replication: int | None = None,
                     bootstrap: str | None = None, replicas: list[int] | None = None) -> None:
        """Create `topic` and return once every partition has a leader; with `replicas`, every
        partition on exactly those nodes (the first its leader), as kafka-topics'
        --replica-assignment places them.

        Straight to the cluster (no `bootstrap`) it is created in this process with librdkafka's
        admin client: Kafka's own tool (kafka-topics) sends the same CreateTopics, but starting
        its JVM costs about 2 s, some twenty times in the suite's real-time half, where
        nothing measures it. Through another bootstrap (a proxy in front of the cluster) Kafka's
        tool runs as before, as a user's would: the tests that give one look at what it sent.
        """
        rf = replication if replication is not None else min(3, len(self.nodes))
        if bootstrap is not None:
            assert replicas is None, "replicas are placed only straight to the cluster"
            self.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
                          "--create", "--topic", topic, "--partitions", str(partitions),
                          "--replication-factor", str(rf))
            return
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        # operation_timeout: the broker answers once the topic is created, as it does for
        # kafka-topics (whose request carries a timeout too), not at once.
        new_topic = (NewTopic(topic, partitions, rf) if replicas is None
                     else NewTopic(topic, partitions, replica_assignment=[replicas] * partitions))
        admin.create_topics([new_topic], operation_timeout=30)[topic].result(timeout=60)
        deadline = time.monotonic() + 30
        while True:
            described = admin.list_topics(topic, timeout=10).topics[topic]
            if described.error is None and len(described.partitions) == partitions and all(
                    partition.leader >= 0 for partition in described.partitions.values()):
                return
            if time.monotonic() > deadline:
                raise KafkaHarnessError(f"topic {topic}: no leader for every partition after 30 s: {described}")
            time.sleep(0.05)
