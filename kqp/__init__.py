"""kqp: a Kafka-protocol-aware proxy that enforces Apache Kafka's client quota model."""

__version__ = "0.1.0"
