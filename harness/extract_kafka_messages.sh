#!/usr/bin/env bash
# Refresh kqp/protocol/kafka_message_definitions from the kafka-clients jar the harness assembles:
# Kafka's own JSON message definitions (Apache-2.0) with the jar's LICENSE and NOTICE, and the
# error codes with their names (errors.tsv, `code<TAB>NAME`), read with javap from the static
# initializer of org.apache.kafka.common.protocol.Errors: each constant is built as
# `new Errors; dup; ldc NAME; <ordinal>; <code>; ...`.
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
javap -c -p -classpath "$jar" org.apache.kafka.common.protocol.Errors | awk '
function int_pushed(line,   words, n) {
    if (line ~ /iconst_m1/) return -1
    if (match(line, /iconst_[0-5]/)) return substr(line, RSTART + 7, 1) + 0
    n = split(line, words, /[ \t]+/); return words[n] + 0
}
/static \{\};/ { initializer = 1 }
!initializer { next }
/ new / && /\/\/ class org\/apache\/kafka\/common\/protocol\/Errors$/ { step = 1; next }
step == 1 && /dup/ { step = 2; next }
step == 2 && /\/\/ String / { name = $0; sub(/.*\/\/ String /, "", name); step = 3; next }
step == 3 { step = 4; next }
step == 4 { print int_pushed($0) "\t" name; step = 0; next }
{ step = 0 }' > "$out"/errors.tsv
[ -s "$out"/errors.tsv ] || { echo "no error codes read from $jar" >&2; exit 1; }
