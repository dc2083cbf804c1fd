"""Code generated from Kafka's JSON message definitions by harness/kafka_codegen.py."""
