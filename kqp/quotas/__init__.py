"""kqp.quotas."""
