"""kqpsim: the deterministic simulator. Modelled Kafka clients drive the real kqp proxy on
virtual time, and the same clients run against a modelled broker that enforces Kafka's own
quota arithmetic (kafka_reference, written from Kafka's source, sharing no code with
kqp.quotas); a scenario-seed gives the same figures on any machine. docs/testing.md says what
it asserts; `python -m kqpsim` runs one scenario-seed. kqp never imports it (import-linter)."""
