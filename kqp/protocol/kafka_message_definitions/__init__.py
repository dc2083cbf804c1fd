"""Apache Kafka's JSON message definitions, copied unchanged from the kafka-clients jar.

Not kqp code: these are Apache Kafka's files (Apache License 2.0, see LICENSE and NOTICE in
this folder), refreshed with `make kafka-messages`; KAFKA_VERSION names the release.
"""
