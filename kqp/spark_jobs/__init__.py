"""kqp.spark_jobs."""
