"""kqp.proxy."""
