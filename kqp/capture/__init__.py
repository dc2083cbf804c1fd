"""Traffic capture: one record per proxied request/response pair, written to Parquet.

The schema here is the contract between the proxy (writer) and the Spark jobs (readers);
it is documented in docs/capture-schema.md.
"""
