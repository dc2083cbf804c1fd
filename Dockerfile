# The kqp proxy image used by docker-compose.yml.
FROM python:3.11-slim

WORKDIR /opt/kqp
COPY pyproject.toml README.md ./
COPY kqp ./kqp
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home kqp \
    && mkdir -p /var/lib/kqp/capture /etc/kqp \
    && chown kqp /var/lib/kqp/capture

USER kqp
# bootstrap, broker node ports (node_port_base 9200 + node id), metrics endpoint
EXPOSE 9192 9200-9209 9644
ENTRYPOINT ["kqp"]
CMD ["serve", "--config", "/etc/kqp/kqp.yaml"]
