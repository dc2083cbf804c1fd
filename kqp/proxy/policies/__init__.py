"""Quota enforcement as policies: Kafka's charging, and the opt-in policies beyond Kafka.

One module per policy, each a factory of per-connection objects that decide by verdicts
(kqp.proxy.policies.policy); the state they share across connections is the registry
(kqp.proxy.policies.registry); the chain (kqp.proxy.policies.chain) runs them and folds
their verdicts by its written rule.

* kafka_charging: produce/fetch byte rates and request time, where KafkaApis charges them;
* kafka_mutations: the controller mutation quota (KIP-599), refusing topics at arrival;
* one_at_a_time: a throttled client's every connection read one request at a time;
* cluster_hold: `scope: cluster`, a throttle holds the client's other connections;
* fair_turns: `fair_connection_turns`, one budget's connections muted in turns;
* fleet_mutation_order: in a fleet, mutations charged in the fleet's order.
"""
