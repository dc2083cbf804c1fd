# The kqp proxy image used by docker-compose.yml, in two stages: the first builds kqp's wheel with
# its per-request modules compiled (mypyc, setup.py; the same build `make setup` makes in place),
# the second installs that wheel into a slim image without a compiler.
FROM python:3.11-slim AS build

RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY kqp ./kqp
# pip builds in an isolated environment with pyproject's build requirements (setuptools, mypy).
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

WORKDIR /opt/kqp
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && python -c "import kqp, sys; sys.exit(kqp.BUILD != 'compiled')" \
    && useradd --system --uid 10001 --no-create-home kqp \
    && mkdir -p /var/lib/kqp/capture /etc/kqp \
    && chown kqp /var/lib/kqp/capture

USER kqp
# bootstrap, broker node ports (node_port_base 9200 + node id), metrics endpoint
EXPOSE 9192 9200-9209 9644
ENTRYPOINT ["kqp"]
CMD ["serve", "--config", "/etc/kqp/kqp.yaml"]
