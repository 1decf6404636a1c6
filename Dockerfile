# syntax=docker/dockerfile:1
# cdcserver as a sidecar image:
#   docker build -t cdcserver .
#   docker run -p 127.0.0.1:27017:27017 -v cdcserver-data:/data cdcserver
# Spark stays out of it (no JVM). For `cdcserver spark-replay` in the image, add Java 17 and
# the `spark` extra (pyspark, pandas) with:
#   docker build --build-arg WITH_SPARK=1 -t cdcserver:spark .
# Bookworm, because Debian 13 (trixie) no longer packages openjdk-17.
ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG WITH_SPARK=0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cdcserver/ cdcserver/
COPY pipeline_stages/ pipeline_stages/
# Wheels of cdcserver and of every dependency: the final stage installs from these alone.
RUN extra="" \
    && if [ "$WITH_SPARK" = 1 ]; then extra="[spark]"; fi \
    && pip wheel --no-cache-dir --wheel-dir /wheels ".${extra}"

FROM ${PYTHON_IMAGE}
ARG WITH_SPARK=0
# Debian's security updates replace a pinned version, so a pin would break rebuilds; the
# base image's tag pins the Debian release.
# hadolint ignore=DL3008
RUN if [ "$WITH_SPARK" = 1 ]; then \
        mkdir -p /usr/share/man/man1 \
        && apt-get update \
        && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# The wheels are mounted, not copied, so they leave no layer behind.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    extra="" \
    && if [ "$WITH_SPARK" = 1 ]; then extra="[spark]"; fi \
    && python -m venv /opt/cdcserver \
    && /opt/cdcserver/bin/pip install --no-cache-dir --no-index --find-links=/wheels \
        "cdcserver${extra}"
RUN useradd --system --no-log-init --uid 10001 --user-group --home-dir /data \
        --shell /usr/sbin/nologin cdcserver \
    && mkdir -p /data /etc/cdcserver \
    && chown cdcserver:cdcserver /data
# Binds 0.0.0.0 and keeps the embedded store in /data (see the file for why); a file
# mounted at this path replaces it.
COPY deploy/cdcserver.toml /etc/cdcserver/cdcserver.toml
ENV PATH=/opt/cdcserver/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# The wire protocol, and the Prometheus metrics endpoint.
EXPOSE 27017 9216
# SIGTERM: stop accepting, answer in-flight getMores, flush the store (server.shutdown_grace_s,
# under docker's 10 s stop timeout).
STOPSIGNAL SIGTERM
# Reads the same config (and CDCSERVER_* variables) as the server, so it follows its port
# and TLS; with tls.require_client_certificate, override it with a --uri carrying a client
# certificate.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["cdcserver", "ping", "--config", "/etc/cdcserver/cdcserver.toml", "--timeout", "5"]
# Arguments to `docker run IMAGE ...` are appended: e.g. `--upstream mongodb://...`.
ENTRYPOINT ["cdcserver", "serve", "--config", "/etc/cdcserver/cdcserver.toml"]
