# crihook container image. It needs the host's sockets, e.g.:
#   docker run --rm -v /run/containerd:/run/containerd -v /run/crihook:/run/crihook \
#     -v /etc/crihook:/etc/crihook:ro -v /var/lib/crihook:/var/lib/crihook crihook
# crihook drains for 10 s after SIGTERM; give it a longer stop timeout (docker stop -t 15,
# or terminationGracePeriodSeconds >= 15 in a pod).

# Build stage: install into a prefix so the runtime image carries no sources or build tools.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# Non-editable: the package lands in site-packages, the console script in <prefix>/bin.
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="crihook" \
      org.opencontainers.image.description="A CRI runtime proxy for Kubernetes nodes with an ordered chain of hook plugins" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The base image's prefix is /usr/local: the script becomes /usr/local/bin/crihook.
COPY --from=build /install /usr/local
# Default config, so `crihook serve` runs as is; mount /etc/crihook to replace it.
COPY deploy/config.toml /etc/crihook/config.toml
# Default plugins_dir and state_dir exist even when nothing is mounted there.
RUN mkdir -p /etc/crihook/hooks.d /var/lib/crihook
# Root on purpose: crihook connects to the host's root-owned containerd socket and
# creates its own socket for kubelet (root) under the host's /run/crihook.
USER root
STOPSIGNAL SIGTERM
ENTRYPOINT ["crihook"]
CMD ["serve"]
