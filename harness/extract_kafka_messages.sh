#!/usr/bin/env bash
# Refresh kqp/protocol/kafka_message_definitions from the kafka-clients jar the harness assembles:
# Kafka's own JSON message definitions (Apache-2.0) with the jar's LICENSE and NOTICE.
set -euo pipefail
version=${1:-4.3.1}
jar=.cache/kafka-$version/libs/kafka-clients-$version.jar
out=kqp/protocol/kafka_message_definitions
[ -f "$jar" ] || { echo "missing $jar: run make kafka first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unzip -q "$jar" 'common/message/*.json' LICENSE NOTICE -d "$tmp"
find "$out" -name '*.json' -delete
cp "$tmp"/common/message/*.json "$out"/
cp "$tmp"/LICENSE "$tmp"/NOTICE "$out"/
echo "$version" > "$out"/KAFKA_VERSION
