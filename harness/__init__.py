"""Development and test tooling: a real Kafka cluster from Maven Central jars, the demo."""
