"""kqp.config."""
