# Small runtime image: wheels are built in a throw-away stage, so no compiler stays in the image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpubot ./gpubot
COPY gpusim ./gpusim
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres]"

FROM python:3.11-slim
# A fixed uid/gid, so that files mounted into the container can be made readable by it (the SSH
# key: docker-compose.yml; Kubernetes: fsGroup in deploy/k8s/deployment.yaml).
ARG GPUBOT_UID=10001
RUN groupadd --system --gid "$GPUBOT_UID" gpubot \
 && useradd --system --uid "$GPUBOT_UID" --gid gpubot --create-home --home-dir /home/gpubot \
      --shell /usr/sbin/nologin gpubot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "gpubot[postgres]" && rm -rf /wheels
USER gpubot:gpubot
WORKDIR /home/gpubot
ENTRYPOINT []
CMD ["gpubot", "serve"]
