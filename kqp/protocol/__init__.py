"""kqp.protocol."""
